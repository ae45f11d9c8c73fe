"""The rollout workflow interface: how a prompt becomes scored trajectories."""

from __future__ import annotations

import abc
import asyncio
from typing import Any, Protocol

from arealite.api.io_struct import ModelRequest, ModelResponse
from arealite.api.trajectory import TensorDict


class GenerateEngine(Protocol):
    """What an episode may call on the engine it is handed: one sample per request.

    An ``InferenceEngine`` is one; so is any client or test double with ``agenerate``. Typed as
    this protocol rather than as ``InferenceEngine`` so that the engine interface (which runs
    workflows) and the workflow interface (which calls the engine) do not import each other.
    """

    async def agenerate(self, req: ModelRequest) -> ModelResponse: ...


async def generate_group(engine: GenerateEngine, reqs: list[ModelRequest]) -> list[ModelResponse]:
    """One response per request, in order: the engine's ``agenerate_group`` when it has one
    (``RemoteInferenceEngine`` sends a GRPO group's samples in one batched call), else one
    ``agenerate`` per request, concurrently. Each response is what ``agenerate`` would give."""
    group = getattr(engine, "agenerate_group", None)
    if group is not None:
        return await group(reqs)
    return list(await asyncio.gather(*(engine.agenerate(r) for r in reqs)))


class RolloutWorkflow(abc.ABC):
    """Subclass this (in your own file) and name it in the config by import path.

    ``arun_episode`` runs on the executor's event loop, many at once: never block it (no
    ``time.sleep``, no heavy CPU work; rewards go through a process pool). It returns a
    trajectory dict following the contract in ``arealite.api.trajectory`` (padded ``[B, S]``
    ``input_ids``, ``attention_mask``, ``loss_mask``, ``logprobs``, ``versions`` and
    ``rewards [B]``), or ``None`` to reject the episode.
    """

    @abc.abstractmethod
    async def arun_episode(self, engine: GenerateEngine, data: dict[str, Any]) -> TensorDict | None: ...
