"""What every weight transport is: a trainer half and a client half (docs/weight_updates.md).

A transport moves the trainer's weights (or, with LoRA, its adapter) to the servers one way:
from disk, over a broadcast group, by shared-memory reference, over vLLM's own transfer, or
an adapter from disk or from memory. Each is one subclass of ``WeightTransport`` in this room;
``arealite.weights.table`` maps their names to them and picks one, once, from the config and
the server backend. Nothing outside this room branches on which one runs: the engine hands its
model to ``upload`` (every trainer rank) and the client hands its pool to ``update`` (rank 0's
client), and ``arealite.weights.push`` drives the two together.

The client half of a full-weight transport plugs into ``WeightSync.run``'s shared sequence
(pause -> begin -> transfer -> end -> continue, with its failure reports): ``prepare`` runs
before anything is paused (it may publish what the trainer waits for), ``transfer`` between
begin and end. An adapter transport replaces ``update`` (it loads beside the running versions).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import aiohttp
import torch.distributed as dist
from torch import nn

from arealite.api.config.weights import WeightUpdateConfig
from arealite.api.io_struct import WeightUpdateMeta, WeightUpdateReport

if TYPE_CHECKING:  # the client's shared mechanisms: handed in, never built here
    from arealite.weights.adapter_versions import AdapterVersions
    from arealite.weights.fanout import WeightSync
    from arealite.weights.upload import DistributedUploader


class AdapterAccess(Protocol):
    """A LoRA model's adapter, as the engine exposes it (``arealite.engine.lora.ModelAdapter``)."""

    def gather(self) -> dict[str, Any] | None:
        """Full adapter tensors on rank 0 (None elsewhere). Collective."""
        ...

    def save(self, path: str) -> None:
        """peft's folder at ``path`` on rank 0. Collective."""
        ...

    def config(self) -> dict[str, Any]:
        """``adapter_config.json`` as a dict."""
        ...


@dataclass
class TrainerSide:
    """What one trainer rank hands a transport's trainer half."""

    model: nn.Module
    rank: int
    world_size: int
    group: Any  # the training group (collectives of the upload run over it)
    uploader: DistributedUploader  # rank 0's broadcast group, kept across updates
    save_hf: Callable[[str], dict[str, Any] | None]  # HF folder; rank 0 gets the full state
    adapter: AdapterAccess | None = None  # LoRA: only the adapter moves

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        dist.barrier(group=self.group)


@dataclass
class PoolSide:
    """What rank 0's client hands a transport's client half: the pool's shared mechanisms."""

    session: aiohttp.ClientSession
    sync: WeightSync  # fan-out over the pool with failure reports, the pause sequence
    adapters: AdapterVersions  # the LoRA adapter versions the servers hold
    on_pause: Callable[[bool], None] | None = None


class WeightTransport:
    """One way weights reach the servers. Subclasses are stateless: state that lives across
    updates (a broadcast group, the adapter versions) belongs to the side handed in."""

    name: ClassVar[str]
    # a failed update is tried again over the servers still alive (``push_weights``)
    retryable: ClassVar[bool] = False
    # the trainer hosts a group at ``weight_update.master_port``: every rank needs rank 0's port
    needs_group_port: ClassVar[bool] = False
    # the servers' weights can be checked against the trainer's checksums after an update
    verifiable: ClassVar[bool] = True

    # ------------------------------------------------------------------ the update's meta

    @classmethod
    def make_meta(cls, wu: WeightUpdateConfig, version: int, disk_root: Path,
                  master_port: int, actor: Any) -> WeightUpdateMeta:
        """The update to ``version`` as this transport moves it."""
        raise NotImplementedError

    # ------------------------------------------------------------------ trainer half

    def upload(self, side: TrainerSide, meta: WeightUpdateMeta) -> None:
        """What every trainer rank does to send ``meta.version``. Collective."""
        raise NotImplementedError

    # ------------------------------------------------------------------ client half

    async def update(self, pool: PoolSide, addrs: list[str],
                     meta: WeightUpdateMeta) -> WeightUpdateReport:
        """Move ``addrs`` to ``meta.version``; raises ``WeightUpdateError`` (with ``.report``)."""
        return await pool.sync.run(pool.session, addrs, meta, on_pause=pool.on_pause,
                                   transport=self)

    async def prepare(self, sync: WeightSync, session: aiohttp.ClientSession, addrs: list[str],
                      meta: WeightUpdateMeta, timeout: float, failed: dict[str, str]) -> list[str]:
        """Before anything is paused: check and publish; returns the servers taking part."""
        return addrs

    async def transfer(self, sync: WeightSync, session: aiohttp.ClientSession,
                       alive: list[str], meta: WeightUpdateMeta, failed: dict[str, str],
                       timeout: float) -> list[str]:
        """The paused servers (update sessions open) receive the weights; returns those that
        did, the others go to ``failed``."""
        raise NotImplementedError

    def disk_copy(self, meta: WeightUpdateMeta) -> WeightUpdateMeta | None:
        """The full weights of ``meta.version`` on disk, from which a server back after a
        failure can reload (None: this transport leaves none)."""
        return None
