"""LoRA weight pushes, the two adapter transports: each version is a new adapter loaded beside
the old ones, and nothing is paused (unless ``meta.lora_pause``).

A LoRA run's trainer sends only its adapter for version k, named ``<run>-v<k>``
(``WeightUpdateMeta.lora_name``):

- ``AdapterFromDisk``: the trainer writes peft's folder at ``meta.path`` and the ready marker;
  the servers load it with the backend's load call (SGLang's ``/load_lora_adapter``, vLLM's
  ``/v1/load_lora_adapter``).
- ``AdapterFromMemory`` (``weight_update.type=tensor``): trainer rank 0 holds the gathered
  adapter (a few MB) and posts it to every server the client published in ``meta.targets`` as
  SGLang's ``/load_lora_adapter_from_tensors`` payload (``LoadLoRAAdapterFromTensorsReqInput``:
  the peft config dict and one ``ForkingPickler`` dump of ``{peft key: tensor}``, which names
  shared memory (CPU) or CUDA IPC handles (GPU) rather than carrying the bytes, so the servers
  must share the trainer's host); the client waits for ``meta.target_failures``.

The client half of both is ``AdapterVersions.push``: once every server has the adapter it
becomes ``current`` and each new request (and each resumed segment) names it in its body
(``lora_path``). A request in flight keeps the adapter it was sent with, so its tokens all carry
that adapter's version, exactly, without an abort. Versions older than the staleness bound
(``max_head_offpolicyness``) are then unloaded: a server lets requests already running on an
unloaded adapter finish on it. The client engine (``RemoteInferenceEngine``) owns one
``AdapterVersions`` and hands it to the engines that share its version clock, so evaluation
uses the same adapter as training. The base weights never change, so there is nothing to
checksum (``verifiable = False``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import torch

from arealite.api.config.weights import WeightUpdateConfig
from arealite.api.io_struct import WeightUpdateError, WeightUpdateMeta, WeightUpdateReport
from arealite.utils.sync_http import admin_headers, post_json
from arealite.weights.shared_tensors import LORA_FROM_TENSORS_PATH, lora_tensors_body
from arealite.weights.tensor import await_tensor_push, wait_targets
from arealite.weights.transport import PoolSide, TrainerSide, WeightTransport
from arealite.weights.upload import WeightUploadError

if TYPE_CHECKING:
    from arealite.weights.fanout import WeightSync

logger = logging.getLogger("arealite.weights.adapters")


def adapter_name(disk_root: Path, version: int) -> str:
    """``<experiment>-<trial>-v<k>``: unique per run, so runs sharing servers never collide."""
    run = Path(disk_root).resolve()
    return f"{run.parent.parent.name}-{run.parent.name}-v{version}"


class AdapterTransport(WeightTransport):
    """What both adapter transports share: the client half is ``AdapterVersions.push``."""

    verifiable = False

    @classmethod
    def _adapter_meta(cls, meta: WeightUpdateMeta, wu: WeightUpdateConfig, disk_root: Path,
                      version: int) -> WeightUpdateMeta:
        meta.lora_name = adapter_name(disk_root, version)
        meta.lora_pause = wu.lora_pause
        return meta

    async def update(self, pool: PoolSide, addrs: list[str],
                     meta: WeightUpdateMeta) -> WeightUpdateReport:
        return await pool.adapters.push(pool.session, addrs, meta, pool.sync, self,
                                        pool.on_pause)

    async def ready(self, sync: WeightSync, meta: WeightUpdateMeta, timeout: float) -> None:
        """Before any pause: wait for what the trainer must have finished first."""

    def folder(self, meta: WeightUpdateMeta) -> str | None:
        """Where the adapter of ``meta`` lies (a re-admitted server loads it); None: in memory."""
        return None

    async def load(self, sync: WeightSync, session: aiohttp.ClientSession, addrs: list[str],
                   meta: WeightUpdateMeta, report: WeightUpdateReport, timeout: float) -> list[str]:
        """The servers of ``addrs`` that loaded the adapter; the others go to ``report.failed``."""
        raise NotImplementedError


class AdapterFromDisk(AdapterTransport):
    name = "adapter_disk"

    @classmethod
    def make_meta(cls, wu: WeightUpdateConfig, version: int, disk_root: Path,
                  master_port: int, actor: Any) -> WeightUpdateMeta:
        return cls._adapter_meta(WeightUpdateMeta.disk(version, disk_root), wu, disk_root, version)

    def upload(self, side: TrainerSide, meta: WeightUpdateMeta) -> None:
        side.adapter.save(meta.path)
        if side.is_rank0:
            meta.write_disk_marker()
        side.barrier()

    async def ready(self, sync: WeightSync, meta: WeightUpdateMeta, timeout: float) -> None:
        if not meta.path:
            raise WeightUpdateError("a LoRA adapter from disk needs meta.path")
        await sync.wait_disk_ready(meta, timeout)  # before any pause: it can be long

    def folder(self, meta: WeightUpdateMeta) -> str | None:
        return str(meta.path)

    async def load(self, sync: WeightSync, session: aiohttp.ClientSession, addrs: list[str],
                   meta: WeightUpdateMeta, report: WeightUpdateReport, timeout: float) -> list[str]:
        body = {"lora_name": meta.lora_name, "lora_path": str(meta.path)}
        return await sync.fan_out(session, addrs, sync.protocol.lora_paths[0], body,
                                  report.failed, timeout)


class AdapterFromMemory(AdapterTransport):
    name = "adapter_memory"

    @classmethod
    def make_meta(cls, wu: WeightUpdateConfig, version: int, disk_root: Path,
                  master_port: int, actor: Any) -> WeightUpdateMeta:
        meta = WeightUpdateMeta.tensor(version, wu.bucket_size_mb, wu.timeout)
        return cls._adapter_meta(meta, wu, disk_root, version)

    def upload(self, side: TrainerSide, meta: WeightUpdateMeta) -> None:
        tensors = side.adapter.gather()
        if side.is_rank0:
            post_adapter_tensors(meta, side.adapter.config(), tensors)
        side.barrier()

    async def load(self, sync: WeightSync, session: aiohttp.ClientSession, addrs: list[str],
                   meta: WeightUpdateMeta, report: WeightUpdateReport, timeout: float) -> list[str]:
        updated, why = await await_tensor_push(list(addrs), meta, report.failed, timeout,
                                               route=LORA_FROM_TENSORS_PATH)
        if why is not None:
            raise WeightUpdateError(f"LoRA adapter {meta.lora_name}: {why}")
        return updated


# ------------------------------------------------------------------ the client's versions


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
                   meta: WeightUpdateMeta, sync: WeightSync, transport: AdapterTransport,
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
                    meta: WeightUpdateMeta, sync: WeightSync, transport: AdapterTransport,
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


# ------------------------------------------------------------------ the in-memory trainer half


def post_adapter(addr: str, body: dict, timeout: float, headers: dict | None) -> str | None:
    """One ``/load_lora_adapter_from_tensors``; None on success, else the reason."""
    out, reason = post_json(addr, LORA_FROM_TENSORS_PATH, body, timeout, headers)
    if reason is None and not (isinstance(out, dict) and out.get("success")):
        reason = f"refused: {out}"
    return reason


def post_adapter_tensors(meta: WeightUpdateMeta, config: dict,
                         tensors: dict[str, torch.Tensor]) -> None:
    """Rank 0: wait for ``meta.targets``, post the adapter to each, then publish
    ``meta.target_failures`` (``{"*": why}`` when nothing could be sent) which ends the client's
    wait. Never raises: the client turns failures into the update's outcome."""
    deadline = time.monotonic() + meta.timeout
    headers = admin_headers()
    try:
        targets = wait_targets(meta, deadline)
    except WeightUploadError as e:
        meta.target_failures = {"*": str(e)}
        return
    failed: dict[str, str] = {}
    for addr in targets:
        left = max(1.0, deadline - time.monotonic())
        reason = post_adapter(addr, lora_tensors_body(meta.lora_name, config, tensors), left,
                              headers)
        if reason is not None:
            failed[addr] = reason
    meta.lora_tensors = (config, tensors)
    meta.target_failures = failed
