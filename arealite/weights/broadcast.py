"""The broadcast transport: SGLang's weight-update group (``/init_weights_update_group`` once,
then per bucket ``/update_weights_from_distributed`` while the trainer broadcasts as rank 0).

Trainer half: every rank gathers each bucket of ``meta.param_specs`` (FSDP2 all-gather), rank 0
broadcasts it over the group it built exactly as SGLang does (``DistributedUploader``, kept
across updates). Client half: the group's layout is published before anything is paused
(``WeightSync.prepare_group``: the trainer waits for ``meta.world_size``), the buckets are
received between begin and end (``WeightSync.broadcast_buckets``). A server lost before or
inside the broadcast makes the update retryable over the survivors (a new group).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

from arealite.api.config.weights import WeightUpdateConfig
from arealite.api.io_struct import WeightUpdateError, WeightUpdateMeta
from arealite.weights.transport import TrainerSide, WeightTransport

if TYPE_CHECKING:
    from arealite.weights.fanout import WeightSync

logger = logging.getLogger("arealite.weights.broadcast")


class BroadcastTransport(WeightTransport):
    name = "broadcast"
    retryable = True
    needs_group_port = True

    @classmethod
    def make_meta(cls, wu: WeightUpdateConfig, version: int, disk_root: Path,
                  master_port: int, actor: Any) -> WeightUpdateMeta:
        return WeightUpdateMeta.broadcast(
            version, actor.get_param_specs(wu.bucket_size_mb), master_port, wu.master_address,
            wu.group_name, wu.bucket_size_mb, wu.timeout,
        )

    def upload(self, side: TrainerSide, meta: WeightUpdateMeta) -> None:
        # the gathers are the same whoever receives; rank 0 sends to the receiver the client
        # published (``meta.receiver``) with the world size
        secs = side.uploader.upload(side.model, meta, side.is_rank0)
        logger.debug("broadcast weights v%d in %.3f s", meta.version, secs)

    async def prepare(self, sync: WeightSync, session: aiohttp.ClientSession, addrs: list[str],
                      meta: WeightUpdateMeta, timeout: float, failed: dict[str, str]) -> list[str]:
        if not sync.protocol.supports_broadcast:
            raise WeightUpdateError(
                f"{sync.protocol.name} servers do not take SGLang's broadcast updates: set "
                "weight_update.type=disk (see docs/servers.md)")
        return await sync.prepare_group(session, addrs, meta, timeout, failed)

    async def transfer(self, sync: WeightSync, session: aiohttp.ClientSession,
                       alive: list[str], meta: WeightUpdateMeta, failed: dict[str, str],
                       timeout: float) -> list[str]:
        return await sync.broadcast_buckets(session, alive, meta, failed, timeout)
