"""The disk transport: the trainer writes an HF folder per version, the servers reload it.

Trainer half: every rank gathers, rank 0 writes ``meta.path`` (``save_hf``), its checksums
when verifying, and last the ready marker (``meta.write_disk_marker()``) the client waits for.
Client half: wait for the marker before pausing (it can take long), then the backend's reload
calls (SGLang's ``/update_weights_from_disk``, vLLM's ``/collective_rpc`` reload), in order,
on every server still alive.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp

from arealite.api.config.weights import WeightUpdateConfig
from arealite.api.io_struct import WeightUpdateMeta
from arealite.weights.transport import TrainerSide, WeightTransport
from arealite.weights.upload import disk_checksums

if TYPE_CHECKING:
    from arealite.weights.fanout import WeightSync


class DiskTransport(WeightTransport):
    name = "disk"

    @classmethod
    def make_meta(cls, wu: WeightUpdateConfig, version: int, disk_root: Path,
                  master_port: int, actor: Any) -> WeightUpdateMeta:
        return WeightUpdateMeta.disk(version, disk_root)

    def upload(self, side: TrainerSide, meta: WeightUpdateMeta) -> None:
        sd = side.save_hf(meta.path)
        if side.is_rank0:
            if meta.verify:  # before the marker: the client reads them once it sees it
                meta.checksums = disk_checksums(side.model, sd, meta.checksum_dtype)
            meta.write_disk_marker()
        side.barrier()

    async def prepare(self, sync: WeightSync, session: aiohttp.ClientSession, addrs: list[str],
                      meta: WeightUpdateMeta, timeout: float, failed: dict[str, str]) -> list[str]:
        await sync.wait_disk_ready(meta, timeout)
        sync.disk_calls(meta)  # before pausing: a model the backend cannot reload raises
        return addrs

    async def transfer(self, sync: WeightSync, session: aiohttp.ClientSession,
                       alive: list[str], meta: WeightUpdateMeta, failed: dict[str, str],
                       timeout: float) -> list[str]:
        for path, payload in sync.disk_calls(meta):  # in order, each on every server alive
            alive = await sync.fan_out(session, alive, path, payload, failed, timeout)
        return alive

    def disk_copy(self, meta: WeightUpdateMeta) -> WeightUpdateMeta | None:
        return meta
