"""The shared-memory / CUDA IPC transport (``tensor``): SGLang's ``/update_weights_from_tensor``
with tensors passed by reference, for servers on the trainer's host.

Client half: once every server is paused with its update session open, publish them in
``meta.targets`` and wait for the trainer's pushes (``tensor_sync.await_tensor_push``).
Trainer half: every rank gathers each bucket and posts it by reference to its own servers
(``tensor_upload.upload_by_reference``); rank 0 publishes ``meta.target_failures``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

from arealite.api.config import WeightUpdateConfig
from arealite.api.io_struct import WeightUpdateError, WeightUpdateMeta
from arealite.weights.tensor_sync import await_tensor_push
from arealite.weights.tensor_upload import upload_by_reference
from arealite.weights.transport import TrainerSide, WeightTransport

if TYPE_CHECKING:
    from arealite.weights.fanout import WeightSync

logger = logging.getLogger("arealite.weights.tensor")


class TensorTransport(WeightTransport):
    name = "tensor"

    @classmethod
    def make_meta(cls, wu: WeightUpdateConfig, version: int, disk_root: Path,
                  master_port: int, actor: Any) -> WeightUpdateMeta:
        return WeightUpdateMeta.tensor(version, wu.bucket_size_mb, wu.timeout)

    def upload(self, side: TrainerSide, meta: WeightUpdateMeta) -> None:
        secs = upload_by_reference(side.model, meta, side.rank, side.world_size, side.group)
        logger.debug("pushed weights v%d by reference in %.3f s", meta.version, secs)

    async def prepare(self, sync: WeightSync, session: aiohttp.ClientSession, addrs: list[str],
                      meta: WeightUpdateMeta, timeout: float, failed: dict[str, str]) -> list[str]:
        if not sync.protocol.supports_broadcast:  # SGLang's own update routes
            raise WeightUpdateError(
                f"{sync.protocol.name} servers do not take /update_weights_from_tensor: set "
                "weight_update.type=disk (see docs/servers.md)")
        return addrs

    async def transfer(self, sync: WeightSync, session: aiohttp.ClientSession,
                       alive: list[str], meta: WeightUpdateMeta, failed: dict[str, str],
                       timeout: float) -> list[str]:
        alive, why = await await_tensor_push(alive, meta, failed, meta.timeout)
        if why is not None:
            raise WeightUpdateError(f"tensor update to version {meta.version}: {why}")
        return alive
