"""SGLang's LoRA endpoints: ``/load_lora_adapter`` and ``/unload_lora_adapter``.

Bodies and answers as SGLang 0.5.23 (``LoadLoRAAdapterReqInput``: ``lora_name``, ``lora_path``,
``pinned``; ``UnloadLoRAAdapterReqInput``: ``lora_name``; both answer ``LoRAUpdateOutput``
``{"success", "error_message", "loaded_adapters": {name: path}}``, 400 when not a success).
Neither pauses generation nor waits for running requests: the adapter is read outside the
engine thread and registered between two engine steps; an unloaded adapter keeps serving the
sequences that started on it (``servers.lora``).
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from servers import weights
from servers.lora import NOT_ENABLED, LoRAError
from servers.state import ServerState

router = APIRouter()

class LoadLoRAReq(BaseModel):
    model_config = ConfigDict(extra="ignore")
    lora_name: str
    lora_path: str
    pinned: bool = False
    lora_id: str | None = None


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
