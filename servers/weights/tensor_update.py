"""``/update_weights_from_tensor``: new weights from a process on the same host, by reference.

The request is SGLang's (``UpdateWeightsFromTensorReqInput``, docs/protocol.md §5.4; payload
format in ``servers/weights/tensor_payload.py``): the body names shared-memory blocks (CPU) or CUDA IPC
handles (GPU), never the bytes, so a push costs one copy from the shared pages into the model.

Callable on its own, as in SGLang: outside a ``begin_weight_update``/``end_weight_update``
session every call is applied at once (all-or-nothing per call) and, with ``weight_version``,
moves the server's version.

Inside a session a multi-bucket update is atomic: each call's tensors are checked (names,
shapes) and *staged* by reference, and the call that carries ``weight_version`` (the last
bucket) applies every staged bucket plus its own in one engine-thread step, then sets the
version and flushes the cache. ``end_weight_update`` drops buckets still staged (an update whose
last call never came: its sender died or gave up), so the server keeps serving its old weights,
never a mix.

A sender's long-lived shared-memory blocks stay mapped between pushes
(``servers/weights/shared_sources.py``): a push of the same blocks then costs about one copy.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from servers.routes.control import _after_update, _msg
from servers.state import ServerState
from servers.weights import loading as weights
from servers.weights import tensor_payload

router = APIRouter()


class UpdateFromTensorReq(BaseModel):
    model_config = ConfigDict(extra="ignore")
    serialized_named_tensors: list[str]
    load_format: str | None = None
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None
    disable_draft_model: bool | None = None
    torch_empty_cache: bool = False


@router.post("/update_weights_from_tensor")
async def update_weights_from_tensor(obj: UpdateFromTensorReq, request: Request) -> JSONResponse:
    st: ServerState = request.app.state.server
    try:
        named = tensor_payload.named_tensors(obj.serialized_named_tensors, obj.load_format)
    except tensor_payload.PayloadError as e:
        return _msg(False, f"Failed to deserialize tensors: {e}")
    staging = st.weight_session is not None
    if obj.abort_all_requests:
        st.engine.abort(abort_all=True)

    def work():
        t0 = time.perf_counter()
        try:
            checked = weights.check_named_tensors(st.runner.model, named)
            if staging and obj.weight_version is None:
                st.staged_tensors.extend(checked)
                st.shared_sources.note(checked)
                return True, (f"Staged {len(checked)} tensors ({len(st.staged_tensors)} in all); "
                              "they are applied by the call that carries weight_version.")
            batch = (st.staged_tensors + checked) if staging else checked
            # checked and mapped already: one copy each, no rollback copy (loading.py)
            weights.apply_named_tensors(st.runner.model, batch, backup=False)
        except Exception as e:
            if staging:
                st.drop_staged()
            st.shared_sources.update_dropped()
            return False, f"Failed to update weights: {e}"
        finally:
            st.engine.stats["weight_load_seconds_sum"] += time.perf_counter() - t0
        st.staged_tensors = []  # sources not held below are unmapped as their last ref goes
        st.shared_sources.note(checked)
        if obj.weight_version is not None:
            st.shared_sources.update_done()
        return _after_update(st, True, "Success", obj.weight_version, obj.flush_cache)

    async with st.update_guard():
        ok, message = await st.in_engine(work)
    if ok and obj.weight_version is not None:
        message += f" Weight version updated to {obj.weight_version}."
    return _msg(ok, message)
