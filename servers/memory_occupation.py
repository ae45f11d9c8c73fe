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
resume (on a CPU server there is no device memory to give back, so the weights stay put);
``cuda_graph`` is tracked only (no CUDA graphs are captured). While any tag is released the
engine does not step: requests that arrive queue, as while paused, and run after the resume.
"""

from __future__ import annotations

import torch
from fastapi import APIRouter, Body, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict

from servers.engine import Engine

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
    if WEIGHTS in tags and WEIGHTS not in engine.memory_released:
        _move_weights(engine, torch.device("cpu"))
    engine.memory_released.update(tags)


def resume(engine: Engine, tags: list[str] | None) -> None:
    """Engine thread. Raises ValueError (nothing changed) for a tag that is not released."""
    tags = _tags(tags)
    missing = [t for t in tags if t not in engine.memory_released]
    if missing:
        raise ValueError(f"Memory tags {missing} are not released; released: "
                         f"{sorted(engine.memory_released)}.")
    if WEIGHTS in tags:
        _move_weights(engine, engine.runner.device)
    engine.memory_released.difference_update(tags)


def _move_weights(engine: Engine, device: torch.device) -> None:
    runner = engine.runner
    if runner.device.type == "cpu":
        return  # host memory already: nothing to give back
    runner.model.to(device)
    if device.type == "cpu":
        torch.get_device_module(runner.device).empty_cache()


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
