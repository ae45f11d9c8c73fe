"""OpenAI-compatible routes, as SGLang serves them: ``/v1/models``, ``/v1/completions`` and
``/v1/chat/completions`` (non-streaming and SSE streaming), so the official ``openai`` client
works against the embedded server unchanged.

Every choice is one engine ``Sequence`` (``n`` choices share the prompt), run exactly as a
``/generate`` call runs (waits while paused, holds the model-update reader lock). Errors come
back in SGLang's OpenAI error shape ``{"object": "error", "message", "type", "param", "code"}``;
in a stream, after the first chunk, as one ``data: {"error": ...}`` event. With
``--tool-call-parser qwen25`` and ``tools`` in a chat request, ``<tool_call>`` blocks in the
output become ``tool_calls`` (``servers.protocol.tool_parser``); streamed content is held back while it
may be the start of a tool call or of a stop string.
"""

from __future__ import annotations

import json
import time
import uuid
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from servers.engine.lora import openai_lora_path, request_adapters
from servers.engine.sequence import Sequence
from servers.protocol.openai_request import (
    OpenAIRequest,
    choice_seed,
    parse_chat,
    parse_completion,
)
from servers.protocol.request import GrammarSpec, SamplingParams
from servers.protocol.responses import build_output
from servers.protocol.tool_parser import BOT, held_back, parse_tool_calls
from servers.routes import generate as gen
from servers.state import ServerState

router = APIRouter()


def openai_error(message: str, status: int = 400, type_: str = "BadRequestError") -> JSONResponse:
    return JSONResponse({"object": "error", "message": message, "type": type_, "param": None,
                         "code": status}, status_code=status)


def _model_name(state: ServerState) -> str:
    return state.args.served_model_name or state.model_path



def _stream_error(s: Any) -> bytes | None:
    """The SSE error event for a sequence that finished with an error status, else None."""
    if (s.finish or {}).get("status_code", 0) < 400:
        return None
    return _sse({"error": {"message": s.finish.get("message", "error"),
                           "type": "InternalServerError", "code": s.finish["status_code"]}})

@router.get("/v1/models")
async def models(request: Request) -> dict:
    state: ServerState = request.app.state.server
    name = _model_name(state)
    created = int(state.startup_time)
    cards = [{"id": name, "object": "model", "created": created, "owned_by": "sglang",
              "root": name, "parent": None, "max_model_len": state.runner.context_len}]
    if state.runner.lora is not None:  # loaded adapters, as SGLang lists them
        cards += [{"id": n, "object": "model", "created": created, "owned_by": "sglang",
                   "root": path, "parent": name, "max_model_len": None}
                  for n, path in state.runner.lora.loaded().items()]
    return {"object": "list", "data": cards}


@router.get("/v1/models/{model:path}")
async def retrieve_model(model: str, request: Request) -> Response:
    """One model card, as SGLang answers it: the served model only (a 404 otherwise)."""
    state: ServerState = request.app.state.server
    name = _model_name(state)
    if model != name:
        return JSONResponse({"error": {"message": f"The model '{model}' does not exist",
                                       "type": "invalid_request_error", "param": "model",
                                       "code": "model_not_found"}}, status_code=404)
    return JSONResponse({"id": name, "object": "model", "created": int(state.startup_time),
                         "owned_by": "sglang", "root": name, "parent": None,
                         "max_model_len": state.runner.context_len})


def _sequences(state: ServerState, req: OpenAIRequest) -> list[Sequence]:
    """One sequence per choice; raises ``ValueError`` (a 400) for bad parameters or an adapter
    that is not loaded."""
    seqs = []
    one = {k: v for k, v in req.params.items() if k != "n"}
    lora = openai_lora_path(req.model, _model_name(state), req.lora_path)
    adapters = request_adapters(state.runner.lora, lora, len(req.prompts))
    if req.forced_tools and not state.args.tool_call_parser:
        raise ValueError("tool_choice 'required' or a named function needs the server's "
                         "--tool-call-parser (the forced call is written in its format)")
    forced = GrammarSpec("tool_call", json.dumps(req.forced_tools)) if req.forced_tools else None
    # echo with logprobs scores the prompt too (SGLang: logprob_start_len 0 when both are set;
    # ``logprobs: 0`` counts as set, as in OpenAI's legacy API, where it asks for the chosen
    # tokens' logprobs without alternatives)
    start = 0 if req.echo and req.logprobs else -1
    for ids, adapter in zip(req.prompts, adapters):
        for j in range(req.n):
            params = SamplingParams.from_dict(one, state.runner.vocab_size)
            if params.sampling_seed is not None:
                params.sampling_seed = choice_seed(params.sampling_seed, j)
            if forced is not None:
                params.grammar = forced
            prompt = gen._fit_context(list(ids), params, state.runner.context_len,
                                      state.args.allow_auto_truncate)
            seqs.append(Sequence(rid=uuid.uuid4().hex, prompt=prompt, params=params,
                                 return_logprob=req.logprobs, top_logprobs_num=req.top_logprobs,
                                 logprob_start_len=start,
                                 stream=req.stream, lora=adapter))
    return seqs


def _finish(seq: Sequence) -> tuple[str | None, Any]:
    f = seq.finish or {}
    kind = f.get("type")
    return ({"stop": "stop", "length": "length", "abort": "abort"}.get(kind, kind),
            f.get("matched") if kind == "stop" else None)


def _chat_logprobs(state: ServerState, seq: Sequence, lo: int, hi: int) -> dict | None:
    if not seq.return_logprob:
        return None
    tok = state.detok.token_texts
    content = []
    for i in range(lo, hi):
        t = seq.output_ids[i]
        text = tok([t])[0] or ""
        tops = []
        if seq.top_logprobs_num:
            for lp, tid in seq.output_top[i]:
                tt = tok([tid])[0] or ""
                tops.append({"token": tt, "bytes": list(tt.encode()), "logprob": lp})
        content.append({"token": text, "bytes": list(text.encode()),
                        "logprob": seq.output_logprobs[i], "top_logprobs": tops})
    return {"content": content}


def _completion_logprobs(state: ServerState, seq: Sequence, lo: int, hi: int,
                         prompt: bool = False) -> dict | None:
    """OpenAI's legacy logprobs object for output tokens ``[lo, hi)``, led by the prompt's
    tokens when ``prompt`` (echo with logprobs): as SGLang's ``to_openai_style_logprobs``, the
    first prompt token has no logprob (``None``, and ``None`` top logprobs) and
    ``text_offset`` is -1 throughout."""
    if not seq.return_logprob:
        return None
    detok = state.detok
    ids, vals = list(seq.output_ids[lo:hi]), list(seq.output_logprobs[lo:hi])
    top_rows: list = [seq.output_top[i] for i in range(lo, hi)] if seq.top_logprobs_num else []
    if prompt and seq.input_logprobs is not None:
        in_vals = list(seq.input_logprobs)
        ids = seq.prompt[len(seq.prompt) - len(in_vals):] + ids
        vals = in_vals + vals
        if seq.top_logprobs_num:
            top_rows = list(seq.input_top or []) + top_rows
    tops = [None if row is None else {detok.token_texts([tid])[0]: lp for lp, tid in row}
            for row in top_rows]
    return {"tokens": detok.token_texts(ids), "token_logprobs": vals,
            "top_logprobs": tops, "text_offset": [-1] * len(ids)}


def _usage(seqs: list[Sequence], n: int) -> dict[str, int]:
    prompt = sum(len(s.prompt) for s in seqs[::n])
    completion = sum(len(s.output_ids) for s in seqs)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def _final_text(state: ServerState, seq: Sequence) -> str:
    return build_output(seq, len(seq.output_ids), True, state.detok,
                        state.engine.weight_version)["text"]


def _chat_choice(state: ServerState, req: OpenAIRequest, i: int, seq: Sequence) -> dict:
    text = _final_text(state, seq)
    reason, matched = _finish(seq)
    message: dict[str, Any] = {"role": "assistant", "content": text, "reasoning_content": None,
                               "tool_calls": None}
    if req.tools and state.args.tool_call_parser and BOT in text:
        parsed = parse_tool_calls(text, req.tools)
        if parsed.calls:
            message["content"] = parsed.content or None
            # OpenAI's message tool call has no ``index`` (a streamed delta's has)
            message["tool_calls"] = [{k: v for k, v in c.items() if k != "index"}
                                     for c in parsed.calls]
            if reason == "stop":
                reason, matched = "tool_calls", None
    return {"index": i, "message": message, "logprobs": _chat_logprobs(state, seq, 0, len(seq.output_ids)),
            "finish_reason": reason, "matched_stop": matched}


def _completion_choice(state: ServerState, req: OpenAIRequest, i: int, seq: Sequence) -> dict:
    text = _final_text(state, seq)
    if req.echo:
        text = req.prompt_texts[i // req.n] + text
    reason, matched = _finish(seq)
    lp = _completion_logprobs(state, seq, 0, len(seq.output_ids), prompt=req.echo)
    return {"index": i, "text": text, "logprobs": lp,
            "finish_reason": reason, "matched_stop": matched}


async def _serve(request: Request, chat: bool) -> Response:
    state: ServerState = request.app.state.server
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return openai_error("the request body is not valid JSON")
    try:
        parse = parse_chat if chat else parse_completion
        req = parse(body, state.runner.tokenizer, state.runner.vocab_size)
        seqs = _sequences(state, req)
        await gen.attach_grammars(state, seqs)
    except ValueError as e:
        return openai_error(str(e))
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    model = req.model or _model_name(state)
    if req.stream:
        stream = _chat_stream if chat else _completion_stream
        return StreamingResponse(stream(state, req, seqs, rid, model),
                                 media_type="text/event-stream")
    await state.wait_unpaused()
    async with state.lock.reader():
        done = await gen.run_sequences(state, seqs, request)
    if done is None:
        return Response(status_code=499)
    for s in seqs:
        code = (s.finish or {}).get("status_code")
        if code is not None and code >= 400:
            return openai_error(s.finish.get("message", "error"), code, "InternalServerError")
    build = _chat_choice if chat else _completion_choice
    return JSONResponse({
        "id": rid, "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()), "model": model,
        "choices": [build(state, req, i, s) for i, s in enumerate(seqs)],
        "usage": _usage(seqs, req.n),
        "metadata": {"weight_version": state.engine.weight_version},
    })


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    return await _serve(request, chat=True)


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    return await _serve(request, chat=False)


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


class _TextStream:
    """Per-choice streamed text: emits what can no longer turn into a stop string or (with
    tools) a ``<tool_call>``; a started tool call is held until the end."""

    def __init__(self, markers: list[str], tools: bool) -> None:
        self.sent = ""
        self.tokens = 0
        self.markers = markers
        self.tools = tools

    def delta(self, text: str, final: bool) -> str:
        if self.tools and BOT in text:
            text = text[:text.index(BOT)]
            if final:
                text = text.rstrip()
        elif not final:
            text = text[:len(text) - held_back(text, self.markers)]
        if not text.startswith(self.sent) or len(text) <= len(self.sent):
            return ""
        out, self.sent = text[len(self.sent):], text
        return out


async def _chat_stream(state, req: OpenAIRequest, seqs, rid: str, model: str):
    created = int(time.time())
    tools = bool(req.tools and state.args.tool_call_parser)
    markers = list(seqs[0].params.stop) + ([BOT] if tools else [])
    streams = [_TextStream(markers, tools) for _ in seqs]

    def chunk(i: int, delta: dict, reason=None, logprobs=None, matched=None) -> bytes:
        choice = {"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
        if reason is not None:
            choice["matched_stop"] = matched
        return _sse({"id": rid, "object": "chat.completion.chunk", "created": created,
                     "model": model, "choices": [choice]})

    opened = [False] * len(seqs)
    async with aclosing(gen.engine_events(state, seqs)) as events:
        async for i, n_out, final in events:
            s, st = seqs[i], streams[i]
            if final and (err := _stream_error(s)):
                yield err
                break
            if not opened[i]:  # as SGLang: the role chunk comes with the first engine output
                opened[i] = True
                yield chunk(i, {"role": "assistant", "content": ""})
            out = build_output(s, n_out, final, state.detok, state.engine.weight_version)
            text = out["text"]
            lp = _chat_logprobs(state, s, st.tokens, n_out)
            st.tokens = n_out
            delta = st.delta(text, final)
            if delta or (lp and lp["content"]):
                yield chunk(i, {"content": delta}, logprobs=lp)
            if final:
                reason, matched = _finish(s)
                if tools and BOT in text:
                    parsed = parse_tool_calls(text, req.tools)
                    if parsed.calls:
                        yield chunk(i, {"tool_calls": parsed.calls})
                        if reason == "stop":
                            reason, matched = "tool_calls", None
                yield chunk(i, {}, reason=reason, matched=matched)
        else:
            if req.include_usage:
                yield _sse({"id": rid, "object": "chat.completion.chunk", "created": created,
                            "model": model, "choices": [], "usage": _usage(seqs, req.n)})
    yield b"data: [DONE]\n\n"


async def _completion_stream(state, req: OpenAIRequest, seqs, rid: str, model: str):
    created = int(time.time())
    streams = [_TextStream(list(seqs[0].params.stop), False) for _ in seqs]

    def chunk(i: int, text: str, reason=None, logprobs=None, matched=None) -> bytes:
        choice = {"index": i, "text": text, "logprobs": logprobs, "finish_reason": reason}
        if reason is not None:
            choice["matched_stop"] = matched
        return _sse({"id": rid, "object": "text_completion", "created": created, "model": model,
                     "choices": [choice]})

    opened = [False] * len(seqs)
    async with aclosing(gen.engine_events(state, seqs)) as events:
        async for i, n_out, final in events:
            s, st = seqs[i], streams[i]
            if final and (err := _stream_error(s)):
                yield err
                break
            # the echoed prompt (and its logprobs) leads the choice's first chunk, as in SGLang
            first, opened[i] = not opened[i], True
            text = build_output(s, n_out, final, state.detok, state.engine.weight_version)["text"]
            lp = _completion_logprobs(state, s, st.tokens, n_out, prompt=first and req.echo)
            st.tokens = n_out
            delta = st.delta(text, final)
            if first and req.echo:
                delta = req.prompt_texts[i // req.n] + delta
            if delta or (lp and lp["tokens"]):
                yield chunk(i, delta, logprobs=lp)
            if final:
                reason, matched = _finish(s)
                yield chunk(i, "", reason=reason, matched=matched)
        else:
            if req.include_usage:
                yield _sse({"id": rid, "object": "text_completion", "created": created,
                            "model": model, "choices": [], "usage": _usage(seqs, req.n)})
    yield b"data: [DONE]\n\n"
