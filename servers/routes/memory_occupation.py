"""``/release_memory_occupation`` and ``/resume_memory_occupation``, as SGLang serves them.

Co-located RL (AReaL's ``offload()`` / ``onload()``) hands the accelerator to the trainer
between rollouts: the client pauses generation, releases the server's memory, trains, resumes
the memory, updates the weights and continues. SGLang's rules, mirrored here:

- GET or POST, body ``{"tags": [...]}`` optional; no tags (or an empty list) means every tag,
  ``kv_cache``, ``weights`` and ``cuda_graph``. Success answers 200 with a ``null`` body.
- Release only when the server is idle: nothing running, and nothing queued unless generation
  is paused (SGLang asserts ``is_fully_idle(ignore_waiting=paused)``). Here that is a 400.
- Resume of a tag that is not released is an error (SGLang's ``offload_tags.remove`` raises);
  here it is a 400 naming the tag.

What each tag frees on this server: ``kv_cache`` drops the KV cache storage (real on any
device); ``weights`` moves the model to host memory when it sits on an accelerator and back on
resume; on a CPU server, whose weights are host memory already, it writes them to a temporary
file, frees them (process RSS drops by about their size) and reads them back on resume, so the
server comes back with exactly the weights it had;
``cuda_graph`` is tracked only (no CUDA graphs are captured). While any tag is released the
engine does not step: requests that arrive queue, as while paused, and run after the resume.
"""

from __future__ import annotations

import ctypes
import os
import tempfile

import torch
from fastapi import APIRouter, Body, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict

from servers.engine.engine import Engine

router = APIRouter()

KV_CACHE, WEIGHTS, CUDA_GRAPH = "kv_cache", "weights", "cuda_graph"
ALL_TAGS = (KV_CACHE, WEIGHTS, CUDA_GRAPH)


class MemoryOccupationReq(BaseModel):
    model_config = ConfigDict(extra="ignore")
    tags: list[str] | None = None


def _tags(tags: list[str] | None) -> list[str]:
    if not tags:
        return list(ALL_TAGS)
    unknown = sorted(set(tags) - set(ALL_TAGS))
    if unknown:
        raise ValueError(f"Unknown memory tags {unknown}; valid tags are {list(ALL_TAGS)}.")
    return list(dict.fromkeys(tags))


def release(engine: Engine, tags: list[str] | None) -> None:
    """Engine thread. Raises ValueError (nothing changed) when the call is not allowed."""
    tags = _tags(tags)
    idle = not engine.running and (not engine.waiting or engine.paused_mode is not None)
    if not idle:
        raise ValueError("release_memory_occupation should be called only when server is idle.")
    if KV_CACHE in tags:
        engine.runner.cache.release()
        trim_heap()
    if WEIGHTS in tags and WEIGHTS not in engine.memory_released:
        _move_weights(engine, release=True)
    engine.memory_released.update(tags)


def resume(engine: Engine, tags: list[str] | None) -> None:
    """Engine thread. Raises ValueError (nothing changed) for a tag that is not released."""
    tags = _tags(tags)
    missing = [t for t in tags if t not in engine.memory_released]
    if missing:
        raise ValueError(f"Memory tags {missing} are not released; released: "
                         f"{sorted(engine.memory_released)}.")
    if WEIGHTS in tags:
        _move_weights(engine, release=False)
    engine.memory_released.difference_update(tags)


def _move_weights(engine: Engine, release: bool) -> None:
    runner = engine.runner
    if runner.device.type == "cpu":
        _spill(engine) if release else _restore(engine)
        return
    runner.model.to("cpu" if release else runner.device)
    if release:
        torch.get_device_module(runner.device).empty_cache()


def _spill(engine: Engine) -> None:
    """A CPU server's weights to a file, their memory back to the OS (the weights are host
    memory already: the only place to free it for is the trainer beside us)."""
    params = dict(engine.runner.model.named_parameters())  # a tied weight once
    fd, path = tempfile.mkstemp(prefix="arealite-released-weights-", suffix=".pt")
    os.close(fd)
    try:
        torch.save({n: p.detach() for n, p in params.items()}, path)
    except BaseException:
        os.unlink(path)
        raise
    for p in params.values():
        p.data = torch.empty(0, dtype=p.dtype)
    engine.spilled_weights = path
    trim_heap()


def _restore(engine: Engine) -> None:
    path = engine.spilled_weights
    saved = torch.load(path, map_location="cpu", weights_only=True)
    for n, p in engine.runner.model.named_parameters():
        p.data = saved[n]
    engine.spilled_weights = None
    os.unlink(path)


def trim_heap() -> None:
    """Hand freed heap pages back to the OS (glibc keeps them otherwise, and RSS stays)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: the allocator decides


async def _call(request: Request, fn, obj: MemoryOccupationReq | None) -> Response:
    st = request.app.state.server
    try:
        await st.in_engine(lambda: fn(st.engine, obj.tags if obj is not None else None))
    except ValueError as e:
        return JSONResponse({"error": {"message": str(e)}}, status_code=400)
    return JSONResponse(None)


@router.api_route("/release_memory_occupation", methods=["GET", "POST"])
async def release_memory_occupation(
    request: Request, obj: MemoryOccupationReq | None = Body(None)
) -> Response:
    return await _call(request, release, obj)


@router.api_route("/resume_memory_occupation", methods=["GET", "POST"])
async def resume_memory_occupation(
    request: Request, obj: MemoryOccupationReq | None = Body(None)
) -> Response:
    return await _call(request, resume, obj)
