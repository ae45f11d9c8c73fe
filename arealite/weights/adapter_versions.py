"""The adapter versions of one LoRA run that the servers hold, and the one requests name: the
client half of both adapter transports (``adapters.py``: from disk, from memory).

``AdapterVersions.push``: once every server has the adapter it becomes ``current`` and each new
request (and each resumed segment) names it in its body (``lora_path``). A request in flight
keeps the adapter it was sent with, so its tokens all carry that adapter's version, exactly,
without an abort. Versions older than the staleness bound (``max_head_offpolicyness``) are then
unloaded: a server lets requests already running on an unloaded adapter finish on it. The client
engine (``RemoteInferenceEngine``) owns one ``AdapterVersions`` (a run without LoRA never pushes
one: ``current`` stays None) and hands it to the engines that share its version clock, so
evaluation uses the same adapter as training.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import aiohttp

from arealite.api.io_struct import WeightUpdateError, WeightUpdateMeta, WeightUpdateReport
from arealite.weights.shared_tensors import LORA_FROM_TENSORS_PATH, lora_tensors_body

if TYPE_CHECKING:
    from arealite.weights.fanout import WeightSync

logger = logging.getLogger("arealite.weights.adapter_versions")


class AdapterLoad(Protocol):
    """What ``AdapterVersions.push`` calls of an adapter transport
    (``arealite.weights.adapters.AdapterTransport``, which hands itself in): the versions sit
    below the transports, which know them through ``PoolSide``."""

    def folder(self, meta: WeightUpdateMeta) -> str | None:
        ...

    async def ready(self, sync: WeightSync, meta: WeightUpdateMeta, timeout: float) -> None:
        ...

    async def load(self, sync: WeightSync, session: aiohttp.ClientSession, addrs: list[str],
                   meta: WeightUpdateMeta, report: WeightUpdateReport, timeout: float) -> list[str]:
        ...


class AdapterVersions:
    """The adapter versions of one LoRA run held by the servers, and the one requests use."""

    def __init__(self, max_staleness: int) -> None:
        self.max_staleness = max_staleness
        # (name, version) requests are sent with; None: the base model (no adapter pushed yet)
        self.current: tuple[str, int] | None = None
        # version -> (adapter name, folder; None: pushed in memory)
        self.loaded: dict[int, tuple[str, str | None]] = {}
        self.tensors: tuple[dict, dict] | None = None  # the current in-memory push's adapter

    async def push(self, session: aiohttp.ClientSession, addrs: list[str],
                   meta: WeightUpdateMeta, sync: WeightSync, transport: AdapterLoad,
                   on_pause: Callable[[bool], None] | None = None) -> WeightUpdateReport:
        """Load ``meta.lora_name`` on ``addrs`` the way of ``transport`` (from its folder, or
        in memory by the trainer's own posts), make it current, unload the versions past the
        staleness bound. No pause, unless ``meta.lora_pause``: then the servers are paused
        (``pause_mode``) around the load, as for a full-weight update, and the requests cut by
        it resume on the new adapter (``on_pause`` as in ``WeightSync.run``). Raises
        ``WeightUpdateError`` (with ``.report``) when no server loaded it."""
        t0 = time.monotonic()
        proto = sync.protocol
        report = WeightUpdateReport(version=meta.version)
        timeout = min(sync.step_timeout, meta.timeout)
        folder = transport.folder(meta)  # None: pushed in memory
        paused: list[str] = []
        try:
            await transport.ready(sync, meta, timeout)  # before any pause: it can be long
            if meta.lora_pause:
                if on_pause is not None:
                    on_pause(True)
                path, body = proto.pause_call(sync.pause_mode)
                addrs = paused = await sync.fan_out(session, addrs, path, body, report.failed,
                                                    timeout)
            report.updated = await self._load(session, addrs, meta, sync, transport, report,
                                              timeout)
            self.current = (meta.lora_name, meta.version)  # before continuing: resumed
            # segments of the requests a pause cut carry the new adapter
        except WeightUpdateError as e:
            e.report = report
            meta.abort_reason = meta.abort_reason or str(e)
            raise
        finally:
            if meta.lora_pause:
                await sync.fan_out(session, paused, proto.continue_path, {}, {}, timeout)
                if on_pause is not None:
                    on_pause(False)
            report.seconds = time.monotonic() - t0
        self.loaded[meta.version] = (meta.lora_name, folder)
        if folder is None:  # what the trainer sent, to load on a server re-admitted later
            self.tensors = meta.lora_tensors
        for v in sorted(v for v in self.loaded if v < meta.version - self.max_staleness):
            # failures only logged: a leftover adapter costs memory, never correctness
            await sync.fan_out(session, report.updated, proto.lora_paths[1],
                               {"lora_name": self.loaded.pop(v)[0]}, {}, timeout)
        report.seconds = time.monotonic() - t0
        logger.debug("LoRA adapter %s on %d server(s) in %.3f s", meta.lora_name,
                     len(report.updated), report.seconds)
        return report

    async def _load(self, session: aiohttp.ClientSession, addrs: list[str],
                    meta: WeightUpdateMeta, sync: WeightSync, transport: AdapterLoad,
                    report: WeightUpdateReport, timeout: float) -> list[str]:
        """The servers of ``addrs`` that loaded the adapter; raises ``WeightUpdateError`` when
        none did."""
        if not self.loaded:  # a restarted trainer: servers may hold this name already
            await asyncio.gather(*(self._unload_quietly(session, a, meta.lora_name, sync)
                                   for a in addrs))
        updated = await transport.load(sync, session, addrs, meta, report, timeout)
        if not updated:
            raise WeightUpdateError(
                f"LoRA adapter {meta.lora_name} failed on every server: "
                + "; ".join(f"{a}: {r}" for a, r in report.failed.items()))
        return updated

    async def readmit(self, session: aiohttp.ClientSession, addr: str, sync: WeightSync) -> bool:
        """A server back after a failure (the health probe): load the current adapter on it
        afresh; True once it holds it. Its base weights never moved: nothing else to check."""
        name, version = self.current
        await self._unload_quietly(session, addr, name, sync)
        folder = self.loaded[version][1]
        if folder is None:  # pushed in memory: send the adapter the trainer handed over
            if self.tensors is None:
                return False
            path, body = LORA_FROM_TENSORS_PATH, lora_tensors_body(name, *self.tensors)
        else:
            path, body = sync.protocol.lora_paths[0], {"lora_name": name, "lora_path": folder}
        reason = await sync._post(session, addr, path, body, sync.step_timeout,
                                  headers=sync.admin_headers)
        if reason is not None:
            logger.warning("server %s cannot load adapter %s: %s", addr, name, reason)
        return reason is None

    @staticmethod
    async def _unload_quietly(session: aiohttp.ClientSession, addr: str, name: str,
                              sync: WeightSync) -> None:
        """Unload ``name`` where it may be loaded (a 400 for an unknown name is expected)."""
        await sync._post(session, addr, sync.protocol.lora_paths[1], {"lora_name": name},
                         min(10.0, sync.step_timeout), headers=sync.admin_headers)
