"""The shared-memory / CUDA IPC transport (``tensor``): SGLang's ``/update_weights_from_tensor``
with tensors passed by reference, for servers on the trainer's host. Both halves are here.

Co-located mode runs one server per trainer rank on the same host. The client half pauses the
servers, opens their update sessions and publishes them in ``meta.targets``, then waits for
``meta.target_failures`` (``await_tensor_push``): the payload names shared memory of the
trainer's process, so it cannot come from anywhere else. The trainer half
(``upload_by_reference``): every rank gathers each bucket of full tensors (FSDP2 all-gather, a
collective of the training group) and posts it to its own servers (``targets[i]`` for
``i % world_size == rank``) as SGLang's payload: a ``ForkingPickler`` dump naming shared-memory
blocks (CPU) or CUDA IPC handles (GPU). A parameter that is its own full tensor (one rank) is
shared where it lives: after the first push its storage stays in shared memory (the optimizer
updates it in place), and the server keeps it mapped (``servers/weights/shared_sources.py``),
so a push costs the server's one copy; such buckets cost no memory and go in one call. The last
call carries ``weight_version``: the server applies every staged bucket at once, so a rank that
dies halfway leaves its server on the old weights.

Rank 0 hashes what it sent (``meta.checksums``, when ``meta.verify``) and publishes
``meta.target_failures``; every rank raises ``WeightUploadError`` when any push failed.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from arealite.api.config.weights import WeightUpdateConfig
from arealite.api.io_struct import WeightUpdateError, WeightUpdateMeta
from arealite.utils.sync_http import admin_headers, post_json
from arealite.weights.shared_tensors import release_payload_refs, serialize_named_tensors
from arealite.weights.transport import TrainerSide, WeightTransport
from arealite.weights.upload import WeightUploadError, _check_abort, _gather, param_specs
from arealite.weights.verify import dtype_name, tensor_checksum

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


# ------------------------------------------------------------------ the client half


async def await_tensor_push(alive: list[str], meta: WeightUpdateMeta, failed: dict[str, str],
                            timeout: float, poll: float = 0.005,
                            route: str = "/update_weights_from_tensor",
                            ) -> tuple[list[str], str | None]:
    """``(servers updated, None)`` or ``(..., why the whole update failed)``; per-server
    failures go to ``failed``."""
    meta.target_failures = None
    meta.targets = list(alive)  # last: the trainer starts pushing when it sees it
    deadline = time.monotonic() + timeout
    while meta.target_failures is None:
        if meta.abort_reason:
            return [], f"the trainer's push failed: {meta.abort_reason}"
        if time.monotonic() >= deadline:
            return [], f"the trainer did not push the weights within {timeout:.0f} s"
        await asyncio.sleep(poll)
    got = dict(meta.target_failures)
    if "*" in got:
        return [], f"the trainer's push failed: {got['*']}"
    for a, reason in got.items():
        failed.setdefault(a, f"{route}: {reason}")
    return [a for a in alive if a not in got], None


# ------------------------------------------------------------------ the trainer half


def wait_targets(meta: WeightUpdateMeta, deadline: float) -> list[str]:
    while meta.targets is None:
        _check_abort(meta)
        if time.monotonic() >= deadline:
            raise WeightUploadError("meta.targets was never set (the client's update_weights "
                                    "publishes the servers once they are paused)")
        time.sleep(0.002)
    return list(meta.targets)


def post_tensors(addr: str, body: dict, timeout: float, headers: dict | None) -> str | None:
    """One ``/update_weights_from_tensor``; None on success, else the reason."""
    out, reason = post_json(addr, "/update_weights_from_tensor", body, timeout, headers)
    if reason is None and not (isinstance(out, dict) and out.get("success")):
        reason = f"refused: {out}"
    return reason


# Statuses a server answers before its handler reads the payload (auth, routing, body
# validation): the payload's block references were never consumed.
_UNREAD_STATUSES = re.compile(r"HTTP (401|403|404|405|413|422):")


def payload_unread(reason: str) -> bool:
    """Whether a failed call surely never unpickled its payload (so its references are ours to
    give back). A timeout or a dropped connection may have been read: left alone, as a block
    released twice would vanish under a later push of the same tensors."""
    return "Connection refused" in reason or _UNREAD_STATUSES.search(reason) is not None


def _aliases(t: torch.Tensor, p: nn.Parameter) -> bool:
    """Whether ``t`` (what ``_gather`` gave) is the parameter's own storage, not a copy."""
    local = p._local_tensor if isinstance(p, DTensor) else p
    return t.untyped_storage().data_ptr() == local.untyped_storage().data_ptr()


def upload_by_reference(model: nn.Module, meta: WeightUpdateMeta, rank: int, world: int,
                        group: dist.ProcessGroup | None = None,
                        headers: dict | None = None) -> float:
    """Push every parameter to this rank's servers (collective over ``group``). Returns seconds."""
    t0 = time.monotonic()
    deadline = t0 + meta.timeout
    headers = admin_headers() if headers is None else headers
    err: str | None = None
    box: list = [None]
    if rank == 0:
        try:
            box[0] = wait_targets(meta, deadline)
        except WeightUploadError as e:
            box[0], err = [], str(e)
    if dist.is_initialized() and world > 1:
        dist.broadcast_object_list(box, src=0, group=group)
    mine = [a for i, a in enumerate(box[0] or []) if i % world == rank]
    params = dict(model.named_parameters())
    buckets = param_specs(model, meta.bucket_size_mb)
    want_dt = getattr(torch, meta.checksum_dtype) if meta.checksum_dtype else None
    sums: dict[str, tuple[str, str]] = {}
    failed: dict[str, str] = {}
    pending: list[tuple[str, torch.Tensor]] = []
    first = 0  # index of the first bucket in pending
    for i, bucket in enumerate(buckets):
        # one rank: _gather aliases the parameter, whose storage the first pickling moves into
        # shared memory for good (later pushes copy nothing here); more ranks: a gathered copy
        named = [(s.name, _gather(params[s.name]).contiguous()) for s in bucket]
        if rank == 0 and meta.verify:
            for n, t in named:
                dt = want_dt or t.dtype
                sums[n] = (dtype_name(dt), tensor_checksum(t, dt))
        pending += named
        last = i == len(buckets) - 1
        if not last and all(_aliases(t, params[n]) for n, t in named):
            # the parameters themselves cost no memory while they wait: such buckets go in
            # one call (each call is an HTTP round trip and a hand-off to the engine thread);
            # gathered copies go at once, so a bucket bounds what they hold
            continue
        calls, pending, where = pending, [], (f"bucket {i + 1}/{len(buckets)}" if first == i
                                              else f"buckets {first + 1}-{i + 1}/{len(buckets)}")
        first = i + 1
        live = [a for a in mine if a not in failed]
        if not live or err is not None:
            continue  # still joined every gather above: the other ranks never wait on us
        for a in live:
            # one payload per receiver: pickling takes one reference on each shared block for
            # the message, and the receiver's unpickling consumes it (torch's protocol)
            body = {"serialized_named_tensors": [serialize_named_tensors(calls)],
                    "flush_cache": last, "abort_all_requests": False,
                    "weight_version": str(meta.version) if last else None}
            left = max(1.0, deadline - time.monotonic())
            reason = post_tensors(a, body, left, headers)
            if reason is not None:
                failed[a] = f"{where}: {reason}"
                if payload_unread(reason):
                    release_payload_refs(calls)  # else its blocks outlive it until we exit
    out: list = [failed]
    if dist.is_initialized() and world > 1:
        out = [None] * world
        dist.all_gather_object(out, failed, group=group)
    failures = {a: r for part in out for a, r in (part or {}).items()}
    if rank == 0:
        if err is None and meta.verify:
            meta.checksums = sums
        meta.target_failures = failures if err is None else {"*": err}
    if err is not None or failures:
        reason = err or "; ".join(f"{a}: {r}" for a, r in failures.items())
        raise WeightUploadError(f"tensor weight upload to version {meta.version} failed: {reason}")
    return time.monotonic() - t0
