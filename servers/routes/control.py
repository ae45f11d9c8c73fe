"""Control endpoints: abort, pause/continue, cache flush, weight updates and versions.

Request bodies are pydantic models that ignore unknown keys and coerce in lax mode, as SGLang's
msgspec bridge does (``"master_port": "29500"`` is accepted). Responses and failure texts follow
SGLang 0.5.23 (docs/protocol.md §2, §4, §5).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from datetime import timedelta
from typing import Literal

import torch
from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict

from servers.state import ServerState
from servers.weights import loading as weights

logger = logging.getLogger(__name__)
router = APIRouter()


class _Req(BaseModel):
    model_config = ConfigDict(extra="ignore")
    rid: str | list[str] | None = None
    http_worker_ipc: str | None = None


class AbortReq(_Req):
    rid: str = ""
    abort_all: bool = False


class PauseReq(_Req):
    mode: Literal["abort", "retract", "in_place"] = "abort"


class ContinueReq(_Req):
    torch_empty_cache: bool = True


class UpdateFromDiskReq(_Req):
    model_path: str
    load_format: str | None = None
    abort_all_requests: bool = False
    weight_version: str | None = None
    flush_cache: bool = True
    torch_empty_cache: bool = False
    keep_pause: bool = False
    recapture_cuda_graph: bool = False
    is_async: bool = False
    token_step: int = 0
    manifest: dict | None = None


class InitGroupReq(_Req):
    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str = "weight_update_group"
    backend: str = "nccl"


class DestroyGroupReq(_Req):
    group_name: str = "weight_update_group"


class BeginReq(_Req):
    selector: Literal["target", "draft", "all"] = "all"


class EndReq(_Req):
    pass


class UpdateFromDistributedReq(_Req):
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    group_name: str = "weight_update_group"
    flush_cache: bool = True
    abort_all_requests: bool = False
    weight_version: str | None = None
    load_format: str | None = None
    selector: Literal["target", "draft", "all"] = "all"
    torch_empty_cache: bool = False


class UpdateVersionReq(_Req):
    new_version: str
    abort_all_requests: bool = True


class GetWeightsReq(_Req):
    name: str
    truncate_size: int = 100


def _st(request: Request) -> ServerState:
    return request.app.state.server


def _msg(ok: bool, message: str, **extra) -> JSONResponse:
    return JSONResponse({"success": ok, "message": message, **extra}, status_code=200 if ok else 400)


_NOT_FLUSHED = (
    "Weights were updated, but the cache was not flushed because requests are still running "
    "or queued. Retract or finish them, then call /flush_cache."
)


@router.post("/abort_request")
async def abort_request(obj: AbortReq, request: Request) -> Response:
    await _st(request).in_engine(lambda: _st(request).engine._abort(obj.rid, obj.abort_all))
    return Response(status_code=200)


@router.post("/pause_generation")
async def pause_generation(obj: PauseReq, request: Request) -> JSONResponse:
    st = _st(request)
    await st.set_paused(True)
    await asyncio.wrap_future(st.engine.pause(obj.mode))
    if obj.mode == "abort":
        # Return only once every in-flight /generate call has answered (SGLang re-aborts each 1 s).
        last = time.monotonic()
        while st.lock.readers > 0:
            await asyncio.sleep(0.02)
            if time.monotonic() - last >= 1.0:
                st.engine.abort(abort_all=True)
                last = time.monotonic()
    return JSONResponse({"message": "Generation paused successfully.", "status": "ok"})


@router.post("/continue_generation")
async def continue_generation(obj: ContinueReq, request: Request) -> JSONResponse:
    st = _st(request)
    await asyncio.wrap_future(st.engine.resume())
    await st.set_paused(False)
    return JSONResponse({"message": "Generation continued successfully.", "status": "ok"})


@router.api_route("/flush_cache", methods=["GET", "POST"])
async def flush_cache(request: Request, timeout: float = Query(0.0, ge=0.0)) -> Response:
    st = _st(request)
    deadline = time.monotonic() + timeout
    while True:
        ok = await st.in_engine(st.engine.flush_cache)
        if ok or time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.05)
    if ok:
        return Response(
            "Cache flushed.\nPlease check backend logs for more details. (When there are running "
            "or waiting requests, the operation will not be performed.)\n", media_type="text/plain",
        )
    return Response("Flush cache failed: requests are running or queued.\n", status_code=400,
                    media_type="text/plain")


def _after_update(st: ServerState, ok: bool, message: str, version: str | None, flush: bool):
    """Engine thread: record the version change, then flush (a refused flush fails the call)."""
    if ok:
        st.engine.set_weight_version(version)
        st.engine.stats["weight_updates_total"] += 1
        if flush and not st.engine.flush_cache():
            return False, _NOT_FLUSHED
    return ok, message


@router.post("/update_weights_from_disk")
async def update_weights_from_disk(obj: UpdateFromDiskReq, request: Request) -> JSONResponse:
    st = _st(request)
    refused = weights.outside_roots(obj.model_path, st.args.weight_roots())
    if refused:  # before anything is aborted or read: the old weights stay
        return _msg(False, refused, num_paused_requests=0)
    if obj.abort_all_requests:
        st.engine.abort(abort_all=True)

    def work():
        t0 = time.perf_counter()
        ok, message = weights.update_weights_from_disk(st.runner.model, obj.model_path)
        st.engine.stats["weight_load_seconds_sum"] += time.perf_counter() - t0
        if ok:
            st.model_path = obj.model_path
        return _after_update(st, ok, message, obj.weight_version, obj.flush_cache)

    async with st.update_guard():
        ok, message = await st.in_engine(work)
    if ok and obj.weight_version is not None:
        message += f" Weight version updated to {obj.weight_version}."
    return _msg(ok, message, num_paused_requests=0)


def _settle(fut: asyncio.Future, result, error: BaseException | None) -> None:
    if not fut.done():
        fut.set_exception(error) if error is not None else fut.set_result(result)


async def _daemon_thread(fn):
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def run() -> None:
        try:
            res = fn()
        except BaseException as e:  # handed to the awaiting route
            loop.call_soon_threadsafe(_settle, fut, None, e)
        else:
            loop.call_soon_threadsafe(_settle, fut, res, None)

    threading.Thread(target=run, name="weight-group-join", daemon=True).start()
    return await fut


@router.post("/init_weights_update_group")
async def init_weights_update_group(obj: InitGroupReq, request: Request) -> JSONResponse:
    st = _st(request)
    if not obj.group_name:
        return _msg(False, "Failed to initialize custom process group: Group name cannot be empty.")
    rank = obj.rank_offset  # one TP rank: rank = rank_offset + tp_rank(0)
    addr = f"[{obj.master_address}]" if ":" in obj.master_address else obj.master_address

    def join():
        return weights.init_custom_process_group(
            backend=obj.backend, init_method=f"tcp://{addr}:{obj.master_port}",
            world_size=obj.world_size, rank=rank, group_name=obj.group_name,
            timeout=timedelta(seconds=st.args.weight_group_timeout),
        )

    try:
        # Blocks until every rank joined (at most --weight-group-timeout): a daemon thread, so
        # generation and /health go on, and a SIGTERM meanwhile still ends the process.
        pg = await _daemon_thread(join)
    except Exception as e:
        return _msg(False, f"Failed to initialize custom process group: {e}.")
    st.groups[obj.group_name] = pg
    return _msg(True, "Succeeded to initialize custom process group.")


@router.post("/destroy_weights_update_group")
async def destroy_weights_update_group(obj: DestroyGroupReq, request: Request) -> JSONResponse:
    st = _st(request)
    pg = st.groups.pop(obj.group_name, None)
    st.recv_buffers.pop(obj.group_name, None)
    if pg is None:
        return _msg(False, "The group to be destroyed does not exist.")
    try:
        torch.distributed.destroy_process_group(pg)
    except Exception as e:
        return _msg(False, f"Failed to destroy custom process group: {e}.")
    return _msg(True, "Succeeded to destroy custom process group.")


@router.post("/begin_weight_update")
async def begin_weight_update(obj: BeginReq, request: Request) -> JSONResponse:
    st = _st(request)
    if st.weight_session is not None:
        return _msg(False, "a weight-update session is already open; call end_weight_update() first")
    st.weight_session = obj.selector
    return _msg(True, "Success")


@router.post("/end_weight_update")
async def end_weight_update(obj: EndReq, request: Request) -> JSONResponse:
    st = _st(request)
    if st.weight_session is None:
        return _msg(False, "no weight-update session is open; call begin_weight_update() first")
    st.weight_session = None
    dropped = st.drop_staged()
    if dropped:
        return _msg(True, f"Success. Dropped {dropped} staged tensors of an update whose last "
                          "call (with weight_version) never came; the old weights are serving.")
    return _msg(True, "Success")


@router.post("/update_weights_from_distributed")
async def update_weights_from_distributed(
    obj: UpdateFromDistributedReq, request: Request
) -> JSONResponse:
    st = _st(request)
    if st.weight_session is None:  # refused without joining the broadcast, as SGLang does
        return _msg(False, "update_weights_from_distributed must run between "
                           "begin_weight_update() and end_weight_update()")
    if obj.abort_all_requests:
        st.engine.abort(abort_all=True)

    def work():
        t0 = time.perf_counter()
        try:
            pg = st.groups.get(obj.group_name)
            if pg is None:
                raise KeyError(f"Group {obj.group_name} not in {list(st.groups)}. "
                               "Please call `init_weights_update_group` first.")
            buf = st.recv_buffers.setdefault(obj.group_name, weights.BucketBuffer())
            named = weights.receive_broadcast(pg, obj.names, obj.dtypes, obj.shapes,
                                              obj.load_format, st.runner.device, buf)
        except Exception as e:
            return False, f"Failed to receive weights: {e}"
        try:
            weights.apply_named_tensors(st.runner.model, named)
        except Exception as e:
            return False, (f"Failed to update parameter online: {e}. The weights were rolled "
                           "back; the old weights are still serving.")
        finally:
            st.engine.stats["weight_load_seconds_sum"] += time.perf_counter() - t0
        return _after_update(st, True, "Succeeded to update parameter online.",
                             obj.weight_version, obj.flush_cache)

    async with st.update_guard():
        ok, message = await st.in_engine(work)
    if ok and obj.weight_version is not None:
        message += f" Weight version updated to {obj.weight_version}."
    return _msg(ok, message)


@router.post("/update_weight_version")
async def update_weight_version(obj: UpdateVersionReq, request: Request) -> JSONResponse:
    st = _st(request)
    if obj.abort_all_requests:
        st.engine.abort(abort_all=True)
    try:
        await st.in_engine(lambda: st.engine.set_weight_version(obj.new_version))
    except Exception as e:
        return JSONResponse({"success": False, "message": f"Failed to update weight version: {e}"},
                            status_code=400)
    return JSONResponse({"success": True, "message": f"Weight version updated to {obj.new_version}",
                         "new_version": obj.new_version})


@router.api_route("/get_weights_by_name", methods=["GET", "POST"])
async def get_weights_by_name(obj: GetWeightsReq, request: Request) -> JSONResponse:
    st = _st(request)
    try:
        ret = await st.in_engine(
            lambda: weights.get_weights_by_name(st.runner.model, obj.name, obj.truncate_size)
        )
    except Exception as e:
        return JSONResponse({"error": {"message": str(e)}}, status_code=400)
    if ret is None:
        return JSONResponse({"error": {"message": "Get parameter by name failed"}}, status_code=400)
    return JSONResponse(ret)
