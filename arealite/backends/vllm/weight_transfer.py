"""The client's half of a distributed weight update to vLLM servers: vLLM's native
weight-transfer API (NCCL backend), driven by ``WeightSync`` in place of SGLang's group calls.

Checked against vLLM 0.32's source (``vllm/entrypoints/rl/online/api_router.py``,
``vllm/distributed/weight_transfer/nccl_engine.py``, ``nccl_common.py``, ``clients.py``):

- ``GET /get_world_size`` -> ``{"world_size": tp * pp * dp}``: the ranks one server adds.
- ``POST /init_weight_transfer_engine`` ``{"init_info": {master_address, master_port,
  rank_offset, world_size, packed, packed_buffer_size_bytes, packed_num_buffers}}``
  (``NCCLWeightTransferInitInfo``): every worker joins the trainer's group (a
  ``StatelessProcessGroup`` whose TCPStore the trainer, rank 0, hosts, then a
  ``PyNcclCommunicator``) at ``rank_offset + its rank``; the call returns once all joined.
  Once per group, not per update. The server must run with ``--weight-transfer-config
  '{"backend": "nccl"}'`` (the launcher passes it on GPUs).
- Per update: ``POST /start_weight_update`` (no body), ``POST /update_weights``
  ``{"update_info": {names, dtype_names, shapes}}`` (``NCCLWeightTransferUpdateInfo``; it
  returns once the trainer's packed broadcast of those tensors, in that order, arrived),
  ``POST /finish_weight_update`` ``{"weight_version": "v"}`` (loads, then labels the weights).
- ``POST /shutdown_weight_transfer_engine``: frees the group (a rebuild, or the end).

The packing (``packed_buffer_size_bytes``: chunks cut where the running size first exceeds
it) must agree on both sides: both take it from ``meta.bucket_size_mb``. The trainer's half is
``arealite.backends.vllm.weight_send``. vLLM's own ``NCCLTrainerWeightTransferEngine`` drives
one server only (its workers sit at ``rank_offset`` 1), so the client makes these calls
itself, to every server of the pool at its own offset.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import aiohttp

from arealite.api.io_struct import SEND_BUFFERS, ParamSpec, WeightUpdateError, WeightUpdateMeta
from arealite.utils.http import call_json, describe_error

# ``sync`` below is the pool's ``arealite.weights.fanout.WeightSync``, which drives this half;
# the weights room sits above the backends, so it is typed by what is used, not imported.
WeightSync = Any

logger = logging.getLogger("arealite.backends.vllm.weight_transfer")

INIT = "/init_weight_transfer_engine"
START = "/start_weight_update"
UPDATE = "/update_weights"
FINISH = "/finish_weight_update"
SHUTDOWN = "/shutdown_weight_transfer_engine"
WORLD_SIZE = "/get_world_size"

# Where the native path cannot run, what to use instead (one line, config names).
HINT = ("vLLM's native weight transfer needs the trainer and the vLLM servers on CUDA GPUs, "
        "vllm importable by the trainer, and servers started with --weight-transfer-config "
        "'{\"backend\": \"nccl\"}' (the launcher passes it on GPUs); otherwise set "
        "weight_update.type=disk")


def init_payload(meta: WeightUpdateMeta, rank_offset: int, world_size: int) -> dict[str, Any]:
    return {"init_info": {
        "master_address": meta.master_address, "master_port": int(meta.master_port),
        "rank_offset": int(rank_offset), "world_size": int(world_size), "packed": True,
        "packed_buffer_size_bytes": meta.bucket_bytes, "packed_num_buffers": SEND_BUFFERS,
    }}


def update_payload(param_specs: list[list[ParamSpec]]) -> dict[str, Any]:
    """Every parameter, in the order the trainer sends them (the buckets, flattened)."""
    specs = [s for bucket in param_specs for s in bucket]
    return {"update_info": {
        "names": [s.name for s in specs],
        "dtype_names": [str(s.dtype).removeprefix("torch.") for s in specs],
        "shapes": [list(s.shape) for s in specs],
    }}


def finish_payload(version: int) -> dict[str, Any]:
    return {"weight_version": str(version)}


class VLLMTransfer:
    """One client's native-transfer state: the servers' rank offsets and whether their
    transfer engines joined the trainer's current group (kept across updates)."""

    def __init__(self) -> None:
        self.offsets: dict[str, int] = {}
        self.world_size = 0
        self.key: tuple | None = None  # (master_address, port, world_size, buffer bytes)
        self.ready = False  # every server's engine joined the group of ``key``

    async def prepare(self, sync: WeightSync, session: aiohttp.ClientSession, addrs: list[str],
                      meta: WeightUpdateMeta, timeout: float, failed: dict[str, str]) -> list[str]:
        """Before anything is paused: each server's ranks (``/get_world_size``), the layout,
        and, last, ``meta.receiver`` and ``meta.world_size`` for the trainer (which waits for
        the latter). Returns the servers that take part; a changed membership means a new
        group (the old one is shut down where it lives)."""
        if not meta.param_specs:
            raise WeightUpdateError("a distributed weight update needs meta.param_specs")
        if meta.master_port is None:
            raise WeightUpdateError("a distributed weight update needs meta.master_port")
        sizes = await asyncio.gather(
            *(call_json(session, "GET", f"http://{a}{WORLD_SIZE}", timeout=timeout,
                        headers=sync.admin_headers) for a in addrs), return_exceptions=True)
        members: list[tuple[str, int]] = []
        for a, res in zip(addrs, sizes):
            n = None if isinstance(res, BaseException) else (res.body or {}).get("world_size")
            if type(n) is int and n > 0:
                members.append((a, n))
            else:
                why = describe_error(res) if isinstance(res, BaseException) else str(res.body)[:200]
                failed.setdefault(a, f"{WORLD_SIZE}: {why}")
        if not members:
            raise WeightUpdateError(f"no vLLM server answers {WORLD_SIZE}: "
                                    + "; ".join(f"{a}: {r}" for a, r in failed.items()))
        offsets, nxt = {}, 1  # the trainer is rank 0
        for a, n in members:
            offsets[a], nxt = nxt, nxt + n
        key = (meta.master_address, int(meta.master_port), nxt, meta.bucket_bytes)
        if meta.world_size is not None and meta.world_size != nxt:
            raise WeightUpdateError(f"meta.world_size={meta.world_size} but the vLLM servers "
                                    f"need {nxt} (1 + sum of their /get_world_size)")
        if self.ready and (key != self.key or offsets != self.offsets):
            logger.warning("vLLM weight transfer: members %s -> %s; joining a new group",
                           sorted(self.offsets), sorted(offsets))
            await self.shutdown(sync, session, list(offsets))
        self.offsets, self.world_size, self.key = offsets, nxt, key
        meta.backend = "nccl"
        meta.receiver = "vllm"
        meta.world_size = nxt  # last: the trainer reads the rest once it sees this
        return list(offsets)

    async def transfer(self, sync: WeightSync, session: aiohttp.ClientSession,
                       alive: list[str], meta: WeightUpdateMeta, failed: dict[str, str],
                       timeout: float) -> list[str]:
        """The paused servers receive ``meta.version``: join the group (first update), then
        start, receive (while the trainer broadcasts), finish with the version."""
        if set(alive) != set(self.offsets):
            self.ready = False
            raise WeightUpdateError("vLLM servers dropped out before the transfer: "
                                    + "; ".join(f"{a}: {r}" for a, r in failed.items()))
        if not self.ready:
            bad = await self._fan(sync, session, alive, INIT, lambda a: init_payload(
                meta, self.offsets[a], self.world_size), timeout)
            if bad:
                failed.update(bad)
                raise WeightUpdateError(f"{INIT} failed ({HINT}): "
                                        + "; ".join(f"{a}: {r}" for a, r in bad.items()))
            self.ready = True
            sync.group = self.key  # what the servers hold now (destroy_group frees it)
        for path, payload in ((START, None), (UPDATE, update_payload(meta.param_specs)),
                              (FINISH, finish_payload(meta.version))):
            bad = await self._fan(sync, session, alive, path, lambda a, p=payload: p, timeout)
            if bad:
                # a receive with a member missing cannot complete: the group is unusable (and
                # a server whose receive failed holds a half-loaded model: it leaves the pool)
                failed.update(bad)
                self.ready = False
                sync.group = None
                raise WeightUpdateError(f"{path} failed: " + "; ".join(
                    f"{a}: {r}" for a, r in failed.items()))
        return alive

    @staticmethod
    async def _fan(sync: WeightSync, session: aiohttp.ClientSession, addrs: list[str],
                   path: str, payload: Callable[[str], dict[str, Any] | None],
                   timeout: float) -> dict[str, str]:
        """POST to every server at once; {addr: reason} of those that failed. vLLM answers a
        failed worker call with a 500 and then closes the connection (uvicorn, after an
        unhandled exception): ``Connection: close`` keeps the client from reusing it for the
        next call (a ``/resume`` on a closed connection would leave the server paused)."""
        headers = {**sync.admin_headers, "Connection": "close"}
        reasons = await asyncio.gather(*(
            sync._post(session, a, path, payload(a), timeout, headers=headers) for a in addrs))
        bad = {a: r for a, r in zip(addrs, reasons) if r is not None}
        for a, r in bad.items():
            logger.error("weight update: %s failed %s", a, r)
        return bad

    async def shutdown(self, sync: WeightSync, session: aiohttp.ClientSession,
                       addrs: list[str]) -> None:
        """Free the servers' transfer engines (404/500 of a dead or never-joined one ignored)."""
        if self.ready:
            await self._fan(sync, session, addrs, SHUTDOWN, lambda a: None,
                            min(10.0, sync.step_timeout))
        self.ready = False
        sync.group = None
