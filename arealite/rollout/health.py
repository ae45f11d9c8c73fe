"""Is a server that left the pool fit to come back? (The engine's background probe.)"""

from __future__ import annotations

import logging

import aiohttp

from arealite.api.io_struct import WeightUpdateMeta
from arealite.rollout.sglang_protocol import parse_version
from arealite.rollout.weight_sync import get_info
from arealite.utils.http import call_json, describe_error, request_json

logger = logging.getLogger("arealite.rollout.health")


async def ready_for_readmission(
    session: aiohttp.ClientSession,
    addr: str,
    current: int,
    last_disk: WeightUpdateMeta | None,
    timeout: float,
    update_timeout: float,
    admin_headers: dict[str, str] | None = None,
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
        info = await get_info(session, addr, "model_info", timeout)
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
        await call_json(session, "POST", f"http://{addr}/update_weights_from_disk", {
            "model_path": last_disk.path, "weight_version": str(last_disk.version),
        }, timeout=update_timeout, headers=admin_headers)
    except Exception as e:  # noqa: BLE001
        logger.warning("re-syncing %s from %s failed: %s", addr, last_disk.path, describe_error(e))
        return False
    logger.info("server %s re-synced to version %d from %s", addr, current, last_disk.path)
    return True
