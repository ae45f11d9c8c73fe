"""The trainer's half of an in-memory LoRA push: SGLang's ``/load_lora_adapter_from_tensors``.

Rank 0 holds the gathered adapter (a few MB) and posts it to every server the client published in
``meta.targets``, as SGLang's payload (``LoadLoRAAdapterFromTensorsReqInput``): the peft config
dict and one ``ForkingPickler`` dump of ``{peft key: tensor}``, which names shared memory (CPU) or
CUDA IPC handles (GPU) rather than carrying the bytes, so the servers must share the trainer's
host (as for ``weight_update.type=tensor`` full-weight updates). Nothing is paused: the adapter
loads under its own name beside the older versions (``arealite.weights.lora_adapters``).
"""

from __future__ import annotations

import time

import torch

from arealite.api.io_struct import WeightUpdateMeta
from arealite.utils.sync_http import admin_headers, post_json
from arealite.weights.shared_tensors import LORA_FROM_TENSORS_PATH, lora_tensors_body
from arealite.weights.tensor_upload import wait_targets
from arealite.weights.upload import WeightUploadError


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
