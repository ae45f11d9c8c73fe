"""``POST /generate``: SGLang's native generation endpoint (single, batch, n > 1, SSE stream).

Order of checks, as in SGLang: FastAPI body validation (400 shape 1), the contract gate on the
raw JSON (400 ``{"error": "<text>"}``), then normalisation and length checks (400
``{"error": {"message": ...}}``; in stream mode SGLang sends these as an SSE error chunk).
The call then waits while the server is paused, holds the reader side of the model-update lock
for its lifetime, and hands one ``Sequence`` per item to the engine.
"""

from __future__ import annotations

import asyncio
import json
import logging
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from servers.engine.grammar import attach_constraints
from servers.engine.lora import request_adapters
from servers.engine.routed_experts import SequenceRouting
from servers.engine.sequence import Sequence
from servers.engine.vision import attach_images
from servers.protocol.contract import ContractError, check_generate_body
from servers.protocol.openapi_schema import GenerateReqInput
from servers.protocol.request import NormalizedGenerate, normalize_generate
from servers.protocol.responses import build_output
from servers.state import ServerState

logger = logging.getLogger(__name__)
router = APIRouter()


def error_response(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=status)


def _state(request: Request) -> ServerState:
    return request.app.state.server


def _tokenize(state: ServerState, norm: NormalizedGenerate) -> list[list[int]]:
    prompts = []
    ctx = state.runner.context_len
    for item in norm.items:
        if item.input_ids is not None:
            ids = item.input_ids
        else:
            tok = state.runner.tokenizer
            if tok is None:
                raise ValueError("text input needs a tokenizer; the server runs with --skip-tokenizer-init")
            ids = tok.encode(item.text, add_special_tokens=True)
            if not ids:
                raise ValueError("input_ids cannot be empty.")
        ids = _fit_context(ids, item.params, ctx, state.args.allow_auto_truncate)
        if item.return_logprob and item.logprob_start_len > len(ids):
            raise ValueError(
                f"logprob_start_len ({item.logprob_start_len}) is larger than the input length "
                f"({len(ids)} tokens)."
            )
        if state.runner.tokenizer is None and (item.params.stop or item.params.stop_regex):
            raise ValueError("stop strings need a tokenizer; the server runs with --skip-tokenizer-init")
        prompts.append(ids)
    return prompts


def _fit_context(ids: list[int], params, ctx: int, auto_truncate: bool) -> list[int]:
    """SGLang's tokenizer-manager length checks: a prompt that fills the context, or a given
    ``max_new_tokens`` that would run past it, is a 400 unless the server runs with
    ``--allow-auto-truncate``; then the prompt is cut and ``max_new_tokens`` lowered."""
    if len(ids) >= ctx:
        if not auto_truncate:
            raise ValueError(
                f"The input ({len(ids)} tokens) is longer than the model's context length ({ctx} tokens)."
            )
        ids = ids[: ctx - 1]  # the longest prompt this server admits (max_req_input_len)
    mnt = params.requested_max_new_tokens
    if mnt is not None and mnt + len(ids) > ctx:
        if not auto_truncate:
            raise ValueError(
                f"Requested token count exceeds the model's maximum context length of {ctx} "
                f"tokens. You requested a total of {mnt + len(ids)} tokens: {len(ids)} tokens "
                f"from the input messages and {mnt} tokens for the completion. Please reduce the "
                "number of tokens in the input messages or the completion to fit within the limit."
            )
        params.max_new_tokens = max(0, ctx - len(ids))
    return ids


def request_routing(runner, raw: dict, prompts: list[list[int]]) -> list:
    """A ``SequenceRouting`` per item when the body set ``return_routed_experts`` (SGLang's
    request fields), else Nones; ValueError when the server cannot or the start is out of range."""
    if not raw.get("return_routed_experts"):
        return [None] * len(prompts)
    if runner.routed is None:
        raise ValueError("return_routed_experts needs a server launched with "
                         "--enable-return-routed-experts (and a mixture-of-experts model)")
    start = raw.get("routed_experts_start_len") or 0
    out = []
    for ids in prompts:
        if not 0 <= start <= len(ids):
            raise ValueError(f"routed_experts_start_len must be in [0, {len(ids)}] "
                             f"(the prompt's tokens), got {start}")
        out.append(SequenceRouting(runner.num_hidden_layers, runner.routed.top_k, start))
    return out


def _sequences(norm: NormalizedGenerate, prompts: list[list[int]]) -> list[Sequence]:
    return [
        Sequence(
            rid=item.rid, prompt=list(ids), params=item.params,
            return_logprob=item.return_logprob, logprob_start_len=item.logprob_start_len,
            top_logprobs_num=item.top_logprobs_num, stream=norm.stream,
        )
        for item, ids in zip(norm.items, prompts)
    ]


async def attach_grammars(state: ServerState, seqs: list[Sequence]) -> None:
    """Compile the sequences' grammars (structured outputs) off the event loop; a grammar that
    does not compile is a ``ValueError`` (a 400)."""
    if any(s.params.grammar is not None for s in seqs):
        r = state.runner
        await asyncio.to_thread(attach_constraints, state, r.tokenizer, r.vocab_size,
                                r.eos_token_ids, seqs)


def _attach(seqs: list[Sequence], q: asyncio.Queue) -> None:
    loop = asyncio.get_running_loop()
    for i, s in enumerate(seqs):
        def on_event(seq: Sequence, n_out: int, final: bool, i: int = i) -> None:
            loop.call_soon_threadsafe(q.put_nowait, (i, n_out, final))
        s.on_event = on_event


def _out(state: ServerState, norm: NormalizedGenerate, seq: Sequence, n_out: int, final: bool):
    return build_output(
        seq, n_out, final, state.detok, state.engine.weight_version,
        return_text_in_logprobs=norm.return_text_in_logprobs,
        return_prompt_token_ids=norm.return_prompt_token_ids,
        skip_tokenizer_init=state.args.skip_tokenizer_init,
    )


def _abort_unfinished(state: ServerState, seqs: list[Sequence]) -> None:
    for s in seqs:
        if not s.finished:
            state.engine.abort(s.rid)


async def run_sequences(state: ServerState, seqs: list[Sequence], request: Request | None):
    """Submit and wait for all sequences (non-stream); aborts them if the client goes away."""
    q: asyncio.Queue = asyncio.Queue()
    _attach(seqs, q)
    for s in seqs:
        state.engine.submit(s)
    remaining = len(seqs)
    try:
        while remaining:
            try:
                _, _, final = await asyncio.wait_for(q.get(), timeout=1.0)
            except asyncio.TimeoutError:
                if request is not None and await request.is_disconnected():
                    logger.info("client disconnected; aborting %s", [s.rid for s in seqs])
                    _abort_unfinished(state, seqs)
                    return None
                continue
            remaining -= int(final)
    except asyncio.CancelledError:
        _abort_unfinished(state, seqs)
        raise
    return seqs


@router.api_route("/generate", methods=["POST", "PUT"])
async def generate(obj: GenerateReqInput, request: Request) -> Response:
    state = _state(request)
    raw = await request.json()
    try:
        check_generate_body(raw)
    except ContractError as e:
        return JSONResponse({"error": str(e)}, status_code=400)
    try:
        norm = normalize_generate(raw, state.runner.vocab_size)
        prompts = _tokenize(state, norm)
        visions = attach_images(state.runner.vision, raw, norm.items, prompts,
                                state.runner.context_len)
        loras = request_adapters(state.runner.lora, raw.get("lora_path"), len(norm.items))
        routing = request_routing(state.runner, raw, prompts)
    except ValueError as e:
        if obj.stream:
            return StreamingResponse(_stream_error(str(e)), media_type="text/event-stream")
        return error_response(str(e))
    seqs = _sequences(norm, prompts)
    for s, vp, adapter, rt in zip(seqs, visions, loras, routing):
        s.vision = vp
        s.lora = adapter
        s.routing = rt
    try:
        await attach_grammars(state, seqs)
    except ValueError as e:
        if obj.stream:
            return StreamingResponse(_stream_error(str(e)), media_type="text/event-stream")
        return error_response(str(e))
    if norm.stream:
        return StreamingResponse(_stream(state, norm, seqs, request), media_type="text/event-stream")
    await state.wait_unpaused()
    async with state.lock.reader():
        done = await run_sequences(state, seqs, request)
    if done is None:
        return Response(status_code=499)
    for s in seqs:
        code = (s.finish or {}).get("status_code")
        if code is not None and code >= 400:
            return error_response(s.finish.get("message", "error"), code)
    outs = [_out(state, norm, s, len(s.output_ids), True) for s in seqs]
    return JSONResponse(outs[0] if norm.is_single else outs)


async def _stream_error(message: str, code: int = 400):
    err = {"error": {"message": message, "type": "invalid_request_error", "code": code,
                     "retryable": False}}
    yield b"data: " + json.dumps(err).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, allow_nan=False, default=str).encode() + b"\n\n"


async def engine_events(state: ServerState, seqs: list[Sequence]):
    """Submit ``seqs`` (after any pause, under the reader lock a weight update waits for) and
    yield their engine events ``(i, n_out, final)``; on exit the unfinished ones are aborted.
    Open it with ``contextlib.aclosing``, so that a caller leaving early (an error chunk, a client
    gone) aborts the rest and frees the lock at once, not when the generator is collected."""
    await state.wait_unpaused()
    async with state.lock.reader():
        q: asyncio.Queue = asyncio.Queue()
        _attach(seqs, q)
        for s in seqs:
            state.engine.submit(s)
        remaining = len(seqs)
        try:
            while remaining:
                i, n_out, final = await q.get()
                remaining -= int(final)
                yield i, n_out, final
        finally:
            _abort_unfinished(state, seqs)


async def _stream(state: ServerState, norm: NormalizedGenerate, seqs: list[Sequence], request):
    incremental = state.args.incremental_streaming_output
    sent = [0] * len(seqs)
    sent_text = [""] * len(seqs)
    async with aclosing(engine_events(state, seqs)) as events:
        async for i, n_out, final in events:
            s = seqs[i]
            code = (s.finish or {}).get("status_code") if final else None
            if code is not None and code >= 400:
                async for chunk in _stream_error(s.finish.get("message", "error"), code):
                    yield chunk
                return
            out = _out(state, norm, s, n_out, final)
            if incremental:
                out["output_ids"] = out["output_ids"][sent[i]:]
                if "text" in out:
                    full = out["text"]
                    out["text"] = full[len(sent_text[i]):] if full.startswith(sent_text[i]) else full
                    sent_text[i] = full
                sent[i] = n_out
            if not norm.is_single:
                out["index"] = i
            yield _sse(out)
    yield b"data: [DONE]\n\n"
