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

The client half of both is ``AdapterVersions.push`` (``adapter_versions.py``, the versions the
servers hold and the one requests name). The base weights never change, so there is nothing to
checksum (``verifiable = False``).
"""

from __future__ import annotations

import time
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
