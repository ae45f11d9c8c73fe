"""The two engine interfaces every algorithm is written against.

``TrainEngine`` is a model being trained (FSDP2 in ``arealite.engine.fsdp_engine``);
``InferenceEngine`` is the client of a pool of generation servers plus the rollout executor
(``arealite.rollout.remote_engine``). Algorithms never branch on which implementation they hold.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch

from arealite.api.io_struct import (
    FinetuneSpec,
    ModelRequest,
    ModelResponse,
    ParamSpec,
    SaveLoadMeta,
    WeightUpdateMeta,
)
from arealite.api.trajectory import TensorDict
from arealite.api.workflow_api import RolloutWorkflow


class TrainEngine(abc.ABC):
    @abc.abstractmethod
    def initialize(self, addr: str | None = None, ft_spec: FinetuneSpec | None = None) -> None:
        """Join the process group, load/shard the model, build optimizer and scheduler."""

    def destroy(self) -> None:
        """Release the model and process groups."""

    @abc.abstractmethod
    def train_batch(
        self,
        input_: TensorDict,
        loss_fn: Callable[[torch.Tensor, TensorDict], torch.Tensor],
        loss_weight_fn: Callable[[TensorDict], float | torch.Tensor],
    ) -> dict[str, float]:
        """One optimizer step over ``input_`` split into packed micro-batches.

        ``loss_fn(logits, mb)`` returns the mean loss of micro-batch ``mb``;
        ``loss_weight_fn(mb)`` its weight (e.g. its count of loss tokens). Micro-batch losses
        are combined as a global weighted mean across micro-batches and ranks.
        Returns stats such as ``grad_norm``, ``lr`` and ``update_successful``.
        """

    @abc.abstractmethod
    def forward(
        self,
        input_: TensorDict,
        post_hook: Callable[[torch.Tensor, TensorDict], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """No-grad forward; returns per-token values (``[B, S]``) in input order."""

    @abc.abstractmethod
    def upload_weights(self, meta: WeightUpdateMeta) -> None:
        """Send the current weights to the servers (disk or distributed broadcast)."""

    @abc.abstractmethod
    def get_param_specs(self, bucket_size_mb: float | None = None) -> list[list[ParamSpec]]:
        """Parameter specs in broadcast order, split into buckets of at most ``bucket_size_mb``."""

    @abc.abstractmethod
    def save(self, meta: SaveLoadMeta) -> None: ...

    @abc.abstractmethod
    def load(self, meta: SaveLoadMeta) -> None: ...

    @abc.abstractmethod
    def step_lr_scheduler(self) -> None: ...

    @abc.abstractmethod
    def set_version(self, version: int) -> None: ...

    @abc.abstractmethod
    def get_version(self) -> int: ...

    def train(self, mode: bool = True) -> TrainEngine:
        return self

    def eval(self) -> TrainEngine:
        return self.train(False)


class InferenceEngine(abc.ABC):
    @abc.abstractmethod
    def initialize(self, addr: str | list[str] | None = None, train_data_parallel_size: int | None = None) -> None:
        """Connect to the servers (argument, config, or ``AREAL_LLM_SERVER_ADDRS``)."""

    def destroy(self) -> None:
        """Stop background threads and close connections."""

    @abc.abstractmethod
    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        """Generate for one request; resumes across pauses, retries on other servers."""

    async def agenerate_group(self, reqs: list[ModelRequest]) -> list[ModelResponse]:
        """``agenerate`` for each request, concurrently; an engine may send them together."""
        return list(await asyncio.gather(*(self.agenerate(r) for r in reqs)))

    @abc.abstractmethod
    def update_weights(self, meta: WeightUpdateMeta) -> Future[None]:
        """Move every server to ``meta.version`` (pause -> transfer -> resume)."""

    @abc.abstractmethod
    def submit(self, data: dict[str, Any], workflow: RolloutWorkflow) -> None:
        """Queue one episode ``workflow.arun_episode(self, data)`` (subject to the staleness gate)."""

    @abc.abstractmethod
    def wait(
        self,
        count: int,
        timeout: float | None = None,
        should_accept: Callable[[TensorDict], bool] | None = None,
    ) -> TensorDict:
        """Block until ``count`` accepted trajectories exist; return them concatenated."""

    @abc.abstractmethod
    def rollout_batch(self, data: list[dict[str, Any]], workflow: RolloutWorkflow) -> TensorDict:
        """Synchronous: submit every item, wait for all of them."""

    @abc.abstractmethod
    def prepare_batch(
        self,
        dataloader: Any,
        workflow: RolloutWorkflow,
        should_accept: Callable[[TensorDict], bool] | None = None,
    ) -> TensorDict:
        """Asynchronous: keep submitting from ``dataloader`` ahead of the trainer, return a batch."""

    @abc.abstractmethod
    def pause(self) -> None:
        """Stop launching new episodes (running requests are left to the servers' pause)."""

    @abc.abstractmethod
    def resume(self) -> None: ...

    @abc.abstractmethod
    def set_version(self, version: int) -> None: ...

    @abc.abstractmethod
    def get_version(self) -> int: ...
