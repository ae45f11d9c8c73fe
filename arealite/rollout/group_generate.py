"""A GRPO group's samples in one batched ``/generate`` call (``RemoteInferenceEngine.agenerate_group``).

A group is ``n`` requests for the same prompt with the same sampling settings. Sent one by one,
each costs the server a full HTTP request (parsing, validation, routing, a response) and the
requests reach its engine one at a time, spread over several engine steps. SGLang's batch form
(a list of ``input_ids``, one ``sampling_params`` for all, a list of rids; protocol 3.3-3.4)
carries the whole group in one call, admitted to the engine together.

The batch is only the first segment of each sample. Each item's answer becomes that sample's
tokens, logprobs and per-token versions exactly as ``agenerate`` reads a single answer; a sample
cut by a pause (``abort``) is resumed through ``agenerate`` with prompt + tokens so far, as
``agenerate`` resumes its own segments, and its segments are appended. Anything else falls back
to ``agenerate`` per sample, which owns retries, failover and error reporting: a protocol without
a batch form, LoRA adapters or images, samples that differ in settings, a failed or rejected
batch call (a 4xx is then reported by the per-sample call that gets it).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import aiohttp

from arealite.api.io_struct import ModelRequest, ModelResponse
from arealite.api.trajectory import RoutedExpertsError, join_routed_experts
from arealite.backends.base import ProtocolError, Segment
from arealite.rollout.routed_experts import check_complete, join_segment
from arealite.rollout.router import NoHealthyServer
from arealite.utils.http import TRANSPORT_ERRORS, describe_error, error_message

logger = logging.getLogger("arealite.rollout.group_generate")


async def generate_group(engine: Any, reqs: list[ModelRequest]) -> list[ModelResponse]:
    """One response per request of ``reqs`` (a ``RemoteInferenceEngine``'s group), in order."""
    proto = engine.protocol
    encode = getattr(proto, "encode_batch_body", None)
    if not _batchable(engine, reqs, encode):
        return list(await asyncio.gather(*(engine.agenerate(r) for r in reqs)))
    ids_jsons = [r.validate() for r in reqs]
    g = reqs[0].gconfig
    max_new = g.max_new_tokens
    start_version = engine.clock.value
    t0 = time.monotonic()
    pool = engine.pool
    try:
        addr = pool.choose(reqs[0].rid, frozenset(), True)
    except NoHealthyServer:
        return list(await asyncio.gather(*(engine.agenerate(r) for r in reqs)))
    body = encode(ids_jsons, g, max_new, [engine._segment_rid(r.rid) for r in reqs])
    segs: list[Segment] | None = None
    reason = ""
    try:
        async with asyncio.timeout(engine.config.request_timeout):
            data = aiohttp.BytesPayload(body, content_type="application/json")
            async with engine._sessions.get().post(engine._urls[addr], data=data) as r:
                raw = await r.read()
                status = r.status
        if status == 200:
            segs = proto.parse_batch_response(json.loads(raw), len(reqs), start_version)
        else:
            reason = f"HTTP {status}: {error_message(raw.decode(errors='replace'))}"
    except TimeoutError:
        reason = "timed out"
    except (ProtocolError, json.JSONDecodeError, *TRANSPORT_ERRORS) as e:
        reason = describe_error(e)
    finally:
        pool.release(addr, segs is not None)
    if segs is None:
        logger.warning("group %s: batched call to %s failed (%s); sending its %d samples one "
                       "by one", reqs[0].rid, addr, reason, len(reqs))
        return list(await asyncio.gather(*(engine.agenerate(r) for r in reqs)))
    latency = time.monotonic() - t0
    return list(await asyncio.gather(*(
        _finish(engine, req, seg, addr, latency, t0) for req, seg in zip(reqs, segs))))


def _batchable(engine: Any, reqs: list[ModelRequest], encode: Any) -> bool:
    if encode is None or len(reqs) < 2 or engine.pool is None:
        return False
    if engine.adapters.current is not None:  # LoRA: each segment names its adapter version
        return False
    g = reqs[0].gconfig
    return (g.n_samples == 1 and all(r.image_data is None and r.gconfig == g for r in reqs)
            and len({r.rid for r in reqs}) == len(reqs))


async def _finish(engine: Any, req: ModelRequest, seg: Segment, addr: str, latency: float,
                  t0: float) -> ModelResponse:
    """The sample's response from its batch item; a paused (aborted) item resumes alone."""
    prompt = list(req.input_ids)
    max_new = req.gconfig.max_new_tokens
    done = len(seg.output_ids)
    routed = _routed(engine, req, lambda: join_segment(None, seg, len(prompt),
                                                       engine.routed_experts_width))
    if seg.finish_type != "abort" or done >= max_new:
        stop = seg.finish_type if seg.finish_type != "abort" else "length"  # cut exactly there
        resp = ModelResponse(prompt, seg.output_ids, seg.logprobs, seg.versions, stop, latency,
                             latency, addr, seg.scores)
        if req.gconfig.return_routed_experts:
            resp.routed_experts = _routed(engine, req, lambda: check_complete(
                routed, len(prompt) + done, req.rid))
        return resp
    await engine._wait_unpaused(req.rid)
    g = req.gconfig
    if g.constrained:  # a grammar sent again starts over: regenerate from the prompt
        return await engine.agenerate(req)
    rest_g = g.model_copy(update={"max_new_tokens": max_new - done,
                                  "min_new_tokens": max(0, g.min_new_tokens - done)})
    rest = await engine.agenerate(ModelRequest(rid=req.rid, input_ids=prompt + seg.output_ids,
                                               gconfig=rest_g, metadata=req.metadata))
    total = time.monotonic() - t0
    resp = ModelResponse(
        prompt, seg.output_ids + rest.output_tokens, seg.logprobs + rest.output_logprobs,
        seg.versions + rest.output_versions, rest.stop_reason, total,
        latency if done else total - rest.latency + rest.ttft, rest.server, rest.scores,
    )
    if rest.routed_experts is not None:  # the batch item's rows stay, the rest's add to them
        resp.routed_experts = _routed(engine, req, lambda: join_routed_experts(
            routed, rest.routed_experts))
    return resp


def _routed(engine: Any, req: ModelRequest, build: Any) -> Any:
    """``build()``, a routed-experts mismatch failing the request (and so its episode) with
    the request's id in the message."""
    if not req.gconfig.return_routed_experts:
        return None
    try:
        return build()
    except RoutedExpertsError as e:
        raise RoutedExpertsError(f"request {req.rid}: {e}") from e
