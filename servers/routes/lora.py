"""SGLang's LoRA endpoints: ``/load_lora_adapter``, ``/load_lora_adapter_from_tensors`` and
``/unload_lora_adapter``.

Bodies and answers as SGLang 0.5.23 (``LoadLoRAAdapterReqInput``: ``lora_name``, ``lora_path``,
``pinned``; ``UnloadLoRAAdapterReqInput``: ``lora_name``; both answer ``LoRAUpdateOutput``
``{"success", "error_message", "loaded_adapters": {name: path}}``, 400 when not a success).
``/load_lora_adapter_from_tensors`` is SGLang's ``LoadLoRAAdapterFromTensorsReqInput``:
``lora_name``, ``config_dict`` (the adapter_config.json dict), ``serialized_named_tensors`` (one
base64 ``ForkingPickler`` dump of ``{peft key: tensor}`` per TP rank, by shared-memory / CUDA IPC
reference as in ``/update_weights_from_tensor``: ``servers.weights.tensor_payload``), ``load_format``
(null or ``"flattened_bucket"``), ``pinned``, ``expected_checksums`` (name -> sha256 of the
tensor's bytes, checked before loading); such an adapter's path reads ``__tensor__``.
None pauses generation nor waits for running requests: the adapter is read outside the
engine thread and registered between two engine steps; an unloaded adapter keeps serving the
sequences that started on it (``servers.engine.lora``).
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import torch
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from servers.engine.lora import NOT_ENABLED, LoRAError
from servers.state import ServerState
from servers.weights import loading as weights
from servers.weights import tensor_payload

router = APIRouter()

class LoadLoRAReq(BaseModel):
    model_config = ConfigDict(extra="ignore")
    lora_name: str
    lora_path: str
    pinned: bool = False
    lora_id: str | None = None


class LoadLoRAFromTensorsReq(BaseModel):
    model_config = ConfigDict(extra="ignore")
    lora_name: str
    config_dict: dict[str, Any]
    serialized_named_tensors: list[str]
    pinned: bool = False
    added_tokens_config: dict[str, int] | None = None
    lora_id: str | None = None
    load_format: str | None = None
    expected_checksums: dict[str, str] | None = None


class UnloadLoRAReq(BaseModel):
    model_config = ConfigDict(extra="ignore")
    lora_name: str
    lora_id: str | None = None


def _answer(st: ServerState, error: str | None) -> JSONResponse:
    loaded = st.runner.lora.loaded() if st.runner.lora is not None else None
    body = {"success": error is None, "error_message": error, "loaded_adapters": loaded}
    return JSONResponse(body, status_code=200 if error is None else 400)


@router.post("/load_lora_adapter")
async def load_lora_adapter(obj: LoadLoRAReq, request: Request) -> JSONResponse:
    st: ServerState = request.app.state.server
    mgr = st.runner.lora
    if mgr is None:
        return _answer(st, NOT_ENABLED)
    refused = weights.outside_roots(obj.lora_path, st.args.weight_roots())
    if refused:
        return _answer(st, refused.replace("model_path", "lora_path"))
    try:
        adapter = await asyncio.to_thread(mgr.read, obj.lora_name, obj.lora_path, obj.pinned)
        await st.in_engine(lambda: mgr.install(adapter))
    except LoRAError as e:
        return _answer(st, str(e))
    return _answer(st, None)


def _checksum_mismatch(tensors: dict, expected: dict[str, str]) -> str | None:
    """SGLang's check: sha256 of each tensor's raw bytes against ``expected``."""
    bad = [n for n, want in expected.items() if n not in tensors or hashlib.sha256(
        tensors[n].detach().cpu().contiguous().flatten().view(torch.uint8).numpy().tobytes()
    ).hexdigest() != want]
    extra = [n for n in tensors if n not in expected]
    if bad or extra:
        return (f"adapter tensors do not match expected_checksums: {len(bad)} differ or are "
                f"missing {bad[:5]}, {len(extra)} unexpected {extra[:5]}")
    return None


@router.post("/load_lora_adapter_from_tensors")
async def load_lora_adapter_from_tensors(obj: LoadLoRAFromTensorsReq,
                                         request: Request) -> JSONResponse:
    st: ServerState = request.app.state.server
    mgr = st.runner.lora
    if mgr is None:
        return _answer(st, NOT_ENABLED)
    if obj.added_tokens_config:
        return _answer(st, "LoRA adapters with added tokens are not supported")

    def read():
        tensors = tensor_payload.tensor_dict(obj.serialized_named_tensors, obj.load_format)
        if obj.expected_checksums is not None:
            bad = _checksum_mismatch(tensors, obj.expected_checksums)
            if bad:
                raise LoRAError(bad)
        return mgr.from_tensors(obj.lora_name, obj.config_dict, tensors, obj.pinned)

    try:
        adapter = await asyncio.to_thread(read)
        await st.in_engine(lambda: mgr.install(adapter))
    except (LoRAError, tensor_payload.PayloadError) as e:
        return _answer(st, str(e))
    return _answer(st, None)


@router.post("/unload_lora_adapter")
async def unload_lora_adapter(obj: UnloadLoRAReq, request: Request) -> JSONResponse:
    st: ServerState = request.app.state.server
    mgr = st.runner.lora
    if mgr is None:
        return _answer(st, NOT_ENABLED)
    try:
        await st.in_engine(lambda: mgr.unload(obj.lora_name))
    except LoRAError as e:
        return _answer(st, str(e))
    return _answer(st, None)
