"""After a weight update, each server proves it holds the trainer's weights (ARCHITECTURE
invariant 5): its ``/weights_checker`` checksums (docs/protocol.md) against those the trainer
computed for what it sent (``meta.checksums``: name -> (dtype, checksum), in the dtype the
server holds). Only tensors both sides hashed the same way are compared: same name, same dtype,
and a server that says it hashes with ``sha256-64`` (real SGLang on GPUs hashes with its own
kernel under fused names: it answers "not verifiable", logged, never a mismatch).

Both sides of the proof live here: the checksum the trainer computes as it sends
(``tensor_checksum``, per tensor, as a server's ``/weights_checker`` computes it: the first 8
bytes of SHA-256 over the tensor's raw bytes, as 16 hex digits, SGLang's CPU ``_hash_tensor``; a
hash of the bytes changes with any single changed element in any dtype, and the trainer hashes
each tensor in the dtype the server holds it in), and the client's comparison after the update.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from typing import Any

import aiohttp
import torch

from arealite.api.io_struct import WeightUpdateMeta
from arealite.utils.http import call_json, describe_error

logger = logging.getLogger("arealite.weights.verify")

HASH_NAME = "sha256-64"  # what a server that hashes this way reports in "hash"


def tensor_checksum(t: torch.Tensor, dtype: torch.dtype | None = None) -> str:
    """Checksum of ``t`` cast to ``dtype`` (its own when None); a CUDA tensor is copied to CPU."""
    t = t.detach()
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)  # round-to-nearest-even, the same cast a server applies on load
    t = t.contiguous().cpu()
    return hashlib.sha256(memoryview(t.reshape(-1).view(torch.uint8).numpy())).digest()[:8].hex()


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class WeightVerificationError(RuntimeError):
    """A server still held other weights than the trainer's after a re-sync: the run stops."""


async def wait_expected(meta: WeightUpdateMeta, timeout: float) -> dict[str, tuple[str, str]]:
    """The trainer's checksums; it sets them as its upload ends (before the disk marker, or
    right after the last broadcast bucket)."""
    deadline = time.monotonic() + timeout
    while meta.checksums is None:
        if time.monotonic() >= deadline:
            raise WeightVerificationError(
                f"weight update v{meta.version}: the trainer never published its checksums "
                f"(meta.verify is set) within {timeout:.0f} s")
        await asyncio.sleep(0.01)
    return meta.checksums


def compare(expected: dict[str, tuple[str, str]], body: object) -> tuple[int, list[str]]:
    """(tensors compared, one line per differing tensor) for one server's answer."""
    if not isinstance(body, dict) or body.get("hash") != HASH_NAME:
        return 0, []
    compared, bad = 0, []
    for rank in body.get("ranks") or []:
        sums, dtypes = rank.get("checksums") or {}, rank.get("dtypes") or {}
        for name, got in sums.items():
            want = expected.get(name)
            if want is None or dtypes.get(name) != want[0]:
                continue
            compared += 1
            if got != want[1]:
                bad.append(f"{name} ({want[0]}): server {got} != trainer {want[1]}")
    return compared, bad


async def verify(
    session: aiohttp.ClientSession, addrs: list[str], meta: WeightUpdateMeta, timeout: float,
    headers: dict[str, str] | None = None,
) -> dict[str, str]:
    """``{addr: reason}`` for every server whose weights differ from the trainer's (or that
    could not answer ``/weights_checker``). Servers whose checksums cannot be compared are
    logged and pass."""
    expected = await wait_expected(meta, timeout)

    async def one(a: str) -> tuple[str, str | None]:
        try:
            res = await call_json(session, "POST", f"http://{a}/weights_checker",
                                  {"action": "checksum"}, timeout, headers=headers)
        except Exception as e:  # noqa: BLE001 - a server that cannot prove it is not trusted
            if "HTTP 404" in describe_error(e):
                logger.warning("server %s has no /weights_checker: weights not verified", a)
                return a, None
            return a, f"/weights_checker: {describe_error(e)}"
        n, bad = compare(expected, res.body)
        if not n:
            logger.warning("server %s: no tensor comparable with the trainer's checksums "
                           "(other hash, names or dtypes): weights v%d not verified", a, meta.version)
            return a, None
        if bad:
            more = f" (+{len(bad) - 3} more)" if len(bad) > 3 else ""
            return a, f"{len(bad)}/{n} tensors differ: " + "; ".join(bad[:3]) + more
        return a, None

    return {a: r for a, r in await asyncio.gather(*(one(a) for a in addrs)) if r}


class WeightVerifier:
    """What the client does with a mismatch. A server whose checksums differ is taken out of the
    pool and kept out (``quarantined``: the health probe never re-admits it, since it reports
    the current version), then re-synced: from disk here, by broadcast through the trainer
    (``report.resync``, see ``RemoteInferenceEngine.resync_weights``). A verified re-sync brings
    it back; a second mismatch raises ``WeightVerificationError``: the run stops."""

    def __init__(self, weight_sync: Any, timeout: float, admin_headers: dict[str, str] | None):
        self.weight_sync, self.timeout, self.headers = weight_sync, timeout, admin_headers
        self.pool: Any = None  # the engine's ServerRouter, set by its initialize()
        self.quarantined: set[str] = set()

    async def check(self, session: aiohttp.ClientSession, addrs: list[str],
                    meta: WeightUpdateMeta) -> dict[str, str]:
        return await verify(session, addrs, meta, min(self.timeout, meta.timeout), self.headers)

    async def after_update(self, session: aiohttp.ClientSession, report: Any,
                           meta: WeightUpdateMeta, on_disk: bool) -> None:
        """Check the servers ``report`` updated; a mismatch re-syncs from disk when the update
        left the weights there (``on_disk``: the transport's ``disk_copy``), else through the
        trainer (``report.resync``)."""
        t0 = time.monotonic()
        bad = await self.check(session, report.updated, meta)
        for a, why in bad.items():
            self.quarantined.add(a)
            self.pool.mark_unhealthy(a, f"weights differ from the trainer's after v{meta.version}")
            logger.error("WEIGHT MISMATCH: server %s does not hold the trainer's weights v%d "
                         "(%s); taken out of the pool and re-synced", a, meta.version, why)
        if bad and on_disk:  # reload it from there
            await self._resync_from_disk(session, list(bad), meta)
        elif bad:
            report.resync = list(bad)
        report.verify_seconds = time.monotonic() - t0

    async def _resync_from_disk(self, session: aiohttp.ClientSession, addrs: list[str],
                                meta: WeightUpdateMeta) -> None:
        # a second update to just these servers (out of the pool, so nothing is generating)
        failed: dict[str, str] = {}
        ok = list(addrs)
        for path, payload in self.weight_sync.disk_calls(meta, abort_all=True):
            ok = await self.weight_sync.fan_out(session, ok, path, payload, failed,
                                                min(self.timeout, meta.timeout))
        self.admit(addrs, meta, {**failed, **await self.check(session, ok, meta)})

    def admit(self, addrs: list[str], meta: WeightUpdateMeta, bad: dict[str, str]) -> None:
        if bad:
            raise WeightVerificationError(
                f"weights v{meta.version} still differ from the trainer's after a re-sync: "
                + "; ".join(f"{a}: {r}" for a, r in bad.items())
                + " (a server that corrupts or drops updates; the run stops)")
        for a in addrs:
            self.quarantined.discard(a)
            self.pool.mark_healthy(a)
            logger.warning("server %s re-synced to v%d and verified; back in the pool",
                           a, meta.version)
