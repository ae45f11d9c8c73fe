"""The vLLM-native transport: a distributed update over vLLM's own NCCL weight transfer.

Its protocol-level halves live with the backend (``arealite.backends.vllm``): the client's calls
(``weight_transfer.VLLMTransfer``: ``/get_world_size``, ``/init_weight_transfer_engine``,
start / update / finish) and rank 0's send (``weight_send.VLLMSender``, vLLM's packed
producer). This class wires them into a push: the client half runs the backend's calls inside
the shared pause sequence (the client's state is ``WeightSync.native``, kept across updates),
and the trainer half is the broadcast's gathers with rank 0 sending through vLLM's sender, which
the client selects by publishing ``meta.receiver = "vllm"`` before ``meta.world_size``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import aiohttp

from arealite.api.io_struct import WeightUpdateError, WeightUpdateMeta
from arealite.weights.broadcast import BroadcastTransport

if TYPE_CHECKING:
    from arealite.weights.fanout import WeightSync


class VLLMNativeTransport(BroadcastTransport):
    name = "vllm"

    async def prepare(self, sync: WeightSync, session: aiohttp.ClientSession, addrs: list[str],
                      meta: WeightUpdateMeta, timeout: float, failed: dict[str, str]) -> list[str]:
        if sync.native is None:
            raise WeightUpdateError(
                f"{sync.protocol.name} servers have no native weight transfer: set "
                "weight_update.type=disk (see docs/servers.md)")
        return await sync.native.prepare(sync, session, addrs, meta, timeout, failed)

    async def transfer(self, sync: WeightSync, session: aiohttp.ClientSession,
                       alive: list[str], meta: WeightUpdateMeta, failed: dict[str, str],
                       timeout: float) -> list[str]:
        return await sync.native.transfer(sync, session, alive, meta, failed, timeout)
