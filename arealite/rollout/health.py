"""The health of the client's servers: at start-up, every server answering ``/health`` and
speaking what the client needs (``wait_healthy``); later, whether a server that left the pool
is fit to come back (``ready_for_readmission``, the engine's background probe)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import aiohttp

from arealite.api.io_struct import WeightUpdateMeta
from arealite.backends.base import GenerateProtocol
from arealite.backends.sglang import SGLANG, parse_version
from arealite.utils.http import (
    TRANSPORT_ERRORS,
    SessionCache,
    call_json,
    describe_error,
    error_message,
    request_json,
)
from arealite.utils.keys import ClientKeys, check_api_key
from arealite.weights.fanout import get_info

logger = logging.getLogger("arealite.rollout.health")


async def ready_for_readmission(
    session: aiohttp.ClientSession,
    addr: str,
    current: int,
    last_disk: WeightUpdateMeta | None,
    timeout: float,
    update_timeout: float,
    admin_headers: dict[str, str] | None = None,
    protocol: GenerateProtocol = SGLANG,
) -> bool:
    """True when ``addr`` answers ``/health`` and holds version ``current``.

    A restarted server reports its launch version; a non-integer one (SGLang's ``"default"``)
    means its initial weights, version 0. A server on an older version is first re-synced from
    ``last_disk`` when that disk update produced ``current``; otherwise it stays out (only the
    trainer can re-send a distributed update).
    """
    try:
        res = await request_json(session, "GET", f"http://{addr}/health", timeout=timeout)
        if res.status != 200:
            return False
        info = await get_info(session, addr, protocol.version_info, timeout)
    except Exception:  # noqa: BLE001 - still down
        return False
    version = parse_version(info.get("weight_version"), 0)
    if version == current:
        return True
    if last_disk is None or last_disk.version != current:
        logger.warning(
            "server %s is up but holds version %d (current %d); not re-admitted",
            addr, version, current,
        )
        return False
    try:
        for path, body in protocol.disk_update_calls(str(last_disk.path), last_disk.version, True):
            await call_json(session, "POST", f"http://{addr}{path}", body,
                            timeout=update_timeout, headers=admin_headers)
    except Exception as e:  # noqa: BLE001
        logger.warning("re-syncing %s from %s failed: %s", addr, last_disk.path, describe_error(e))
        return False
    logger.info("server %s re-synced to version %d from %s", addr, current, last_disk.path)
    return True


class BackendMismatch(RuntimeError):
    """A server lacks an endpoint its backend's protocol needs (another version or setup)."""


async def check_endpoints(
    session: aiohttp.ClientSession, addrs: list[str], protocol: GenerateProtocol,
    timeout: float, admin_headers: dict[str, str] | None = None,
) -> None:
    """At start-up: every endpoint ``protocol.required_endpoints`` names answers on every
    server (a 404 or 405 means another server version, or one started without the flags the
    backend needs), so a mismatch is one clear error, not a failure at the first update."""
    bad = []
    for addr in addrs:
        for method, path in protocol.required_endpoints:
            body = {} if method == "POST" else None
            try:
                res = await request_json(session, method, f"http://{addr}{path}", body,
                                         timeout=min(timeout, 30.0), headers=admin_headers)
            except Exception as e:  # noqa: BLE001 - reported with the others
                bad.append(f"{addr}{path}: {describe_error(e)}")
                continue
            if res.status in (404, 405):
                bad.append(f"{addr}: {method} {path} -> HTTP {res.status}")
    if bad:
        version = ""
        with contextlib.suppress(Exception):
            res = await request_json(session, "GET", f"http://{addrs[0]}/version", timeout=5.0)
            version = f" (the server says {res.body})" if res.status == 200 else ""
        raise BackendMismatch(
            f"servers do not speak the {protocol.name} protocol arealite needs{version}: "
            + "; ".join(bad) + (". vLLM: use vllm 0.32 (make setup-vllm), started with "
                                "VLLM_SERVER_DEV_MODE=1 and --enable-scale-out (the launcher "
                                "does both)" if protocol.name == "vllm" else ""))


async def wait_healthy(
    sessions: SessionCache, addrs: list[str], timeout: float, keys: ClientKeys,
    protocol: GenerateProtocol,
) -> None:
    """At start-up: wait until every server answers ``/health`` (``TimeoutError`` naming each
    one that did not, and why), then check the api key and the backend's endpoints on all."""
    session = sessions.get()  # the client's session on this loop
    deadline = time.monotonic() + timeout
    reasons = {a: "not tried" for a in addrs}

    async def probe(a: str) -> None:
        while True:
            try:
                left = max(0.1, min(5.0, deadline - time.monotonic()))
                res = await request_json(session, "GET", f"http://{a}/health", timeout=left)
                if res.status == 200:
                    reasons.pop(a, None)
                    return
                reasons[a] = f"HTTP {res.status}: {error_message(res.body)}"
            except TRANSPORT_ERRORS as e:
                reasons[a] = describe_error(e)
            if time.monotonic() + 0.2 >= deadline:
                return
            await asyncio.sleep(0.2)

    await asyncio.gather(*(probe(a) for a in addrs))
    if reasons:
        raise TimeoutError(f"servers not healthy after {timeout:.0f} s: "
                           + "; ".join(f"{a} ({r})" for a, r in reasons.items()))
    await check_api_key(session, addrs, timeout, keys)
    await check_endpoints(session, addrs, protocol, timeout, keys.admin_headers)
