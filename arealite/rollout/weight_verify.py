"""After a weight update, each server proves it holds the trainer's weights (ARCHITECTURE
invariant 5): its ``/weights_checker`` checksums (docs/protocol.md) against those the trainer
computed for what it sent (``meta.checksums``: name -> (dtype, checksum), in the dtype the
server holds). Only tensors both sides hashed the same way are compared: same name, same dtype,
and a server that says it hashes with ``sha256-64`` (real SGLang on GPUs hashes with its own
kernel under fused names: it answers "not verifiable", logged, never a mismatch).
"""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp

from arealite.api.io_struct import WeightUpdateMeta
from arealite.utils.http import call_json, describe_error
from arealite.utils.weight_checksum import HASH_NAME

logger = logging.getLogger("arealite.rollout.weight_verify")


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
