"""The agent proxy: an OpenAI-compatible chat endpoint that turns an agent's calls into
trajectories.

Agent code talks to it with any OpenAI client: in process, ``proxy.client(session)`` is a real
``openai.AsyncOpenAI`` whose transport calls the proxy's ASGI app directly (no socket); out of
process, ``await proxy.serve()`` serves the same app over HTTP and the agent swaps ``base_url``
for ``http://host:port/sessions/<session_id>/v1``. Each chat call applies the chat template
here, then generates token-in/token-out through the engine's ``agenerate`` (the server pool, with
its pause/resume and per-token weight versions), so the session records the exact prompt and
completion ids, logprobs and versions of every turn (``arealite.agent.session``).

Sampling comes from the configured ``gconfig`` (the behaviour policy the trainer corrects for);
an agent's ``temperature``/``top_p`` are ignored, its ``max_tokens``/``max_completion_tokens``
can only lower ``gconfig.max_new_tokens``, and ``n`` must be 1. ``response_format`` and a
forcing ``tool_choice`` become grammar constraints the servers enforce (``arealite.agent.forced``). A streamed call is answered
after generation, as one content chunk (tool calls in one chunk), then the finish chunk.

Routes (in OpenAI's error shape on failure unless said): ``POST /sessions`` (start; returns the id),
``POST /sessions/{id}/v1/chat/completions``, ``POST /sessions/{id}/v1/responses`` (OpenAI's
Responses API, ``arealite.agent.responses_api``), ``POST /sessions/{id}/v1/messages`` and
``.../v1/messages/count_tokens`` (Anthropic's Messages API, ``arealite.agent.messages_api``;
errors in Anthropic's shape), ``GET /sessions/{id}/v1/models``,
``POST /sessions/{id}/reward`` (``{"reward": r, "turn": null | int | completion id}``),
``POST /sessions/{id}/end``.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import time
import uuid
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from arealite.agent import forced, messages_api, responses_api
from arealite.agent.chat import (
    ChatRequestError,
    assistant_close,
    check_tools,
    encode,
    normalize_messages,
    parse_tool_calls,
    render,
    same_message,
)
from arealite.agent.session import AgentSession, Segment, SessionError, Turn
from arealite.api.config.rollout import GenerationHyperparameters
from arealite.api.io_struct import ModelRequest
from arealite.api.trajectory import join_routed_experts
from arealite.api.workflow_api import GenerateEngine

MODEL_NAME = "arealite-policy"


def _error(message: str, status: int = 400) -> JSONResponse:
    kind = {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")
    return JSONResponse(
        {"object": "error", "message": message, "type": kind, "param": None, "code": status},
        status_code=status,
    )


class AgentProxy:
    def __init__(
        self,
        engine: GenerateEngine,
        tokenizer: Any,
        gconfig: GenerationHyperparameters,
        *,
        turn_discount: float = 1.0,
        model_name: str = MODEL_NAME,
        json_any_whitespace: bool = True,
    ) -> None:
        """``json_any_whitespace``: whether a forced tool call's arguments may hold any JSON
        whitespace (SGLang's default; False is its --constrained-json-disable-any-whitespace)."""
        if not 0.0 <= turn_discount <= 1.0:
            raise ValueError("turn_discount must be in [0, 1]")
        self.engine, self.tokenizer, self.model_name = engine, tokenizer, model_name
        self.json_any_whitespace = json_any_whitespace
        self.turn_discount = float(turn_discount)
        eos = tokenizer.eos_token_id
        stops = set(gconfig.stop_token_ids) | ({eos} if eos is not None else set())
        self.gconfig = gconfig.new(n_samples=1, stop_token_ids=sorted(stops))
        self.stop_ids = set(self.gconfig.stop_token_ids)
        self.close = assistant_close(tokenizer)
        self.eos_text = tokenizer.eos_token or ""
        self.sessions: dict[str, AgentSession] = {}
        self.app = Starlette(
            routes=[
                Route("/sessions", self._http_start, methods=["POST"]),
                Route("/sessions/{sid}/v1/chat/completions", self._http_chat, methods=["POST"]),
                Route("/sessions/{sid}/v1/responses", self._http_responses, methods=["POST"]),
                Route("/sessions/{sid}/v1/messages", self._http_messages, methods=["POST"]),
                Route(
                    "/sessions/{sid}/v1/messages/count_tokens",
                    self._http_count_tokens,
                    methods=["POST"],
                ),
                Route("/sessions/{sid}/v1/models", self._http_models, methods=["GET"]),
                Route("/sessions/{sid}/reward", self._http_reward, methods=["POST"]),
                Route("/sessions/{sid}/end", self._http_end, methods=["POST"]),
            ]
        )
        self._server: Any = None
        for name in ("httpx2", "httpx"):  # one INFO line per in-process call otherwise
            if logging.getLogger(name).level == logging.NOTSET:
                logging.getLogger(name).setLevel(logging.WARNING)

    # ---- sessions --------------------------------------------------------------------------
    def start_session(self, session_id: str | None = None) -> AgentSession:
        s = AgentSession(
            session_id=session_id or uuid.uuid4().hex, turn_discount=self.turn_discount
        )
        if s.session_id in self.sessions:
            raise SessionError(f"session {s.session_id} exists")
        self.sessions[s.session_id] = s
        return s

    def end_session(self, session_id: str) -> AgentSession:
        """End a session and forget it (its turns stay on the returned object)."""
        s = self.sessions.pop(session_id)
        s.end()
        return s

    def _in_process(self, sdk: Any, base: str) -> Any:
        """An HTTP client of the SDK's own httpx flavour whose transport calls this app."""
        hx = importlib.import_module(
            sdk.DefaultAsyncHttpxClient.__mro__[1].__module__.split(".")[0]
        )
        return hx.AsyncClient(transport=hx.ASGITransport(app=self.app), base_url=base, timeout=None)

    def client(self, session: AgentSession, **kwargs: Any) -> Any:
        """An ``openai.AsyncOpenAI`` bound to ``session`` that calls this proxy in process
        (chat completions and the Responses API)."""
        import openai

        base = f"http://arealite-proxy/sessions/{session.session_id}/v1"
        return openai.AsyncOpenAI(
            base_url=base,
            api_key="arealite",
            max_retries=0,
            http_client=self._in_process(openai, base),
            **kwargs,
        )

    def anthropic_client(self, session: AgentSession, **kwargs: Any) -> Any:
        """An ``anthropic.AsyncAnthropic`` bound to ``session`` that calls this proxy in process
        (the Messages API)."""
        import anthropic

        base = f"http://arealite-proxy/sessions/{session.session_id}"
        return anthropic.AsyncAnthropic(
            base_url=base,
            api_key="arealite",
            max_retries=0,
            http_client=self._in_process(anthropic, base),
            **kwargs,
        )

    # ---- one chat call ---------------------------------------------------------------------
    def _place(
        self, session: AgentSession, messages: list[dict], tools: list | None, key: str
    ) -> tuple[int | None, list[int], str]:
        """(segment to extend or None, prompt tokens to append, the full rendering)."""
        full = render(self.tokenizer, messages, tools, generation=True)
        for idx in range(len(session.segments) - 1, -1, -1):
            seg = session.segments[idx]
            if seg.tools_key != key or len(messages) <= len(seg.messages):
                continue
            if not all(same_message(a, b) for a, b in zip(seg.messages, messages)):
                continue
            if not full.startswith(seg.rendered):
                break  # the template re-renders this history: a new segment
            last = session.turns[seg.turns[-1]]
            close = self.close
            if (
                last.completion_ids
                and last.completion_ids[-1] in self.stop_ids
                and self.eos_text
                and close.startswith(self.eos_text)
            ):
                close = close[len(self.eos_text) :]  # the model wrote the EOS itself
            return idx, encode(self.tokenizer, close + full[len(seg.rendered) :]), full
        return None, encode(self.tokenizer, full), full

    def _gconfig(self, body: dict[str, Any]) -> GenerationHyperparameters:
        if body.get("n") not in (None, 1):
            raise ChatRequestError("the proxy makes one completion per call: n must be 1")
        cap = body.get("max_completion_tokens") or body.get("max_tokens")
        if cap is None:
            return self.gconfig
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise ChatRequestError(f"max_tokens must be a positive integer, got {cap!r}")
        return self.gconfig.new(
            max_new_tokens=min(cap, self.gconfig.max_new_tokens),
            min_new_tokens=min(self.gconfig.min_new_tokens, cap),
        )

    async def chat(self, session: AgentSession, body: dict[str, Any]) -> dict[str, Any]:
        """Serve one ``/v1/chat/completions`` body for ``session``; returns the response dict."""
        session.check_open()
        if not isinstance(body, dict):
            raise ChatRequestError("the request body must be a JSON object")
        gconfig = self._gconfig(body)
        messages = normalize_messages(body.get("messages"))
        tools = None if body.get("tool_choice") == "none" else check_tools(body.get("tools"))
        grammar = forced.constraint(body, tools, self.json_any_whitespace)
        if grammar:  # the grammar constrains this turn only: the gconfig's own one is replaced
            gconfig = gconfig.new(**{"json_schema": None, "regex": None, "ebnf": None, **grammar})
        key = json.dumps(tools, sort_keys=True)
        idx, new_ids, full = self._place(session, messages, tools, key)
        seg = session.segments[idx] if idx is not None else None
        prompt = (seg.tokens if seg else []) + new_ids
        turn_no = len(session.turns)
        req = ModelRequest(
            rid=f"{session.session_id}-{turn_no}",
            input_ids=prompt,
            gconfig=gconfig,
            metadata={"session": session.session_id},
        )
        resp = await self.engine.agenerate(req)
        out = list(resp.output_tokens)
        body_ids = out[:-1] if out and out[-1] in self.stop_ids else out
        text = self.tokenizer.decode(body_ids, skip_special_tokens=True)
        content, calls = parse_tool_calls(text, tools)
        reason = resp.stop_reason
        if calls and reason == "stop":
            reason = "tool_calls"
        cid = "chatcmpl-" + uuid.uuid4().hex
        reply = {"role": "assistant", "content": content}
        if calls:
            reply["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {
                        "name": c["function"]["name"],
                        "arguments": json.loads(c["function"]["arguments"]),
                    },
                }
                for c in calls
            ]
        # rendered before anything is recorded: a template that rejects the reply fails the
        # call with the session as it was (no segment without a turn)
        rendered = render(self.tokenizer, messages + [reply], tools, generation=False)
        if seg is None:
            seg = Segment(
                tokens=[], loss_mask=[], logprobs=[], versions=[], messages=[], tools_key=key
            )
            session.segments.append(seg)
            idx = len(session.segments) - 1
        seg.tokens += new_ids + out
        if resp.routed_experts is not None:
            seg.routed = join_routed_experts(seg.routed, resp.routed_experts)
        seg.loss_mask += [0] * len(new_ids) + [1] * len(out)
        seg.logprobs += [0.0] * len(new_ids) + [float(x) for x in resp.output_logprobs]
        seg.versions += [-1] * len(new_ids) + [int(v) for v in resp.output_versions]
        seg.messages = messages + [reply]
        seg.rendered = rendered
        seg.turns.append(turn_no)
        session.turns.append(
            Turn(
                cid,
                idx,
                prompt,
                out,
                [float(x) for x in resp.output_logprobs],
                [int(v) for v in resp.output_versions],
                reason,
            )
        )
        return self._response(cid, text, content, calls, reason, out, resp, body, len(prompt))

    def _response(self, cid, text, content, calls, reason, out, resp, body, n_prompt) -> dict:
        logprobs = None
        if body.get("logprobs"):
            toks = [self.tokenizer.decode([t]) for t in out]
            logprobs = {
                "content": [
                    {
                        "token": t,
                        "bytes": list(t.encode()),
                        "logprob": float(lp),
                        "top_logprobs": [],
                    }
                    for t, lp in zip(toks, resp.output_logprobs)
                ]
            }
        return {
            "id": cid,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [
                {
                    "index": 0,
                    "finish_reason": reason,
                    "logprobs": logprobs,
                    "message": {
                        "role": "assistant",
                        "content": content,
                        # no ``index`` here: OpenAI's message tool call has none (a
                        # streamed delta's has, see _as_stream)
                        "tool_calls": [
                            {k: v for k, v in c.items() if k != "index"} for c in calls
                        ]
                        or None,
                    },
                }
            ],
            "usage": {
                "prompt_tokens": n_prompt,
                "completion_tokens": len(out),
                "total_tokens": n_prompt + len(out),
            },
            # OpenAI's metadata is a string -> string map (the SDK's model refuses a list)
            "metadata": {
                "weight_versions": ",".join(str(v) for v in sorted(set(resp.output_versions)))
            },
        }

    # ---- HTTP ------------------------------------------------------------------------------
    def _session(self, request: Request) -> AgentSession:
        sid = request.path_params["sid"]
        if sid not in self.sessions:
            raise KeyError(sid)
        return self.sessions[sid]

    async def _guard(self, request: Request, fn, error=_error) -> Response:
        """Run ``fn(body)``; bad input is one line in the route's own error shape."""
        try:
            raw = await request.body() if request.method == "POST" else b""
            try:
                body = json.loads(raw) if raw.strip() else {}
            except (json.JSONDecodeError, UnicodeDecodeError):
                return error("the request body is not valid JSON")
            return await fn(body)
        except responses_api.ResponseNotFound as e:
            return error(f"Previous response with id {e.args[0]!r} not found.", 404)
        except KeyError as e:
            return error(f"no session {e.args[0]!r}", 404)
        except (ChatRequestError, SessionError) as e:
            return error(str(e))

    async def _http_start(self, request: Request) -> Response:
        async def run(body):
            sid = body.get("session_id") if isinstance(body, dict) else None
            return JSONResponse({"session_id": self.start_session(sid).session_id})

        return await self._guard(request, run)

    async def _http_models(self, request: Request) -> Response:
        async def run(body):
            self._session(request)
            return JSONResponse(
                {
                    "object": "list",
                    "data": [
                        {
                            "id": self.model_name,
                            "object": "model",
                            "created": 0,
                            "owned_by": "arealite",
                        }
                    ],
                }
            )

        return await self._guard(request, run)

    async def _http_reward(self, request: Request) -> Response:
        async def run(body):
            if not isinstance(body, dict) or "reward" not in body:
                raise ChatRequestError('the body must be {"reward": number, "turn": ...}')
            self._session(request).set_reward(body["reward"], body.get("turn"))
            return JSONResponse({"ok": True})

        return await self._guard(request, run)

    async def _http_end(self, request: Request) -> Response:
        async def run(body):
            s = self._session(request)
            s.end()
            return JSONResponse({"ok": True, "turns": len(s.turns), "reward": s.reward})

        return await self._guard(request, run)

    async def _http_chat(self, request: Request) -> Response:
        async def run(body):
            out = await self.chat(self._session(request), body)
            if not body.get("stream"):
                return JSONResponse(out)
            return StreamingResponse(_as_stream(out, body), media_type="text/event-stream")

        return await self._guard(request, run)

    async def _http_responses(self, request: Request) -> Response:
        async def run(body):
            session = self._session(request)
            chat, added = responses_api.to_chat(body, session.stored_responses)
            resp = responses_api.from_chat(await self.chat(session, chat), body)
            if body.get("store", True):
                session.stored_responses[resp["id"]] = (
                    body.get("previous_response_id"),
                    added + [responses_api.reply_message(resp)],
                )
            if not body.get("stream"):
                return JSONResponse(resp)
            return StreamingResponse(responses_api.sse(resp), media_type="text/event-stream")

        return await self._guard(request, run)

    async def _http_messages(self, request: Request) -> Response:
        async def run(body):
            session = self._session(request)
            msg = messages_api.from_chat(await self.chat(session, messages_api.to_chat(body)))
            if not body.get("stream"):
                return JSONResponse(msg)
            return StreamingResponse(messages_api.sse(msg), media_type="text/event-stream")

        return await self._guard(request, run, messages_api.error)

    async def _http_count_tokens(self, request: Request) -> Response:
        async def run(body):
            self._session(request)
            chat = messages_api.to_chat(body, count_only=True)
            tools = None if chat.get("tool_choice") == "none" else check_tools(chat.get("tools"))
            text = render(
                self.tokenizer, normalize_messages(chat["messages"]), tools, generation=True
            )
            return JSONResponse({"input_tokens": len(encode(self.tokenizer, text))})

        return await self._guard(request, run, messages_api.error)

    async def serve(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve the proxy over HTTP on this event loop; returns ``http://host:port``."""
        import uvicorn

        config = uvicorn.Config(self.app, host=host, port=port, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._server.install_signal_handlers = lambda: None  # not the process's main loop
        task = asyncio.get_running_loop().create_task(self._server.serve())
        while not self._server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.02)
        sock = self._server.servers[0].sockets[0].getsockname()
        self._serve_task = task
        return f"http://{sock[0]}:{sock[1]}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            await self._serve_task
            self._server = None


async def _as_stream(out: dict[str, Any], body: dict[str, Any]):
    base = {k: out[k] for k in ("id", "created", "model")}
    choice = out["choices"][0]
    msg = choice["message"]

    def chunk(delta: dict, reason: str | None = None, **extra: Any) -> bytes:
        c = {
            **base,
            "object": "chat.completion.chunk",
            **extra,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}],
        }
        return b"data: " + json.dumps(c).encode() + b"\n\n"

    yield chunk({"role": "assistant", "content": msg["content"] or ""})
    if msg["tool_calls"]:
        yield chunk({"tool_calls": [{"index": i, **c} for i, c in enumerate(msg["tool_calls"])]})
    yield chunk({}, choice["finish_reason"])
    if (body.get("stream_options") or {}).get("include_usage"):
        yield (
            b"data: "
            + json.dumps(
                {**base, "object": "chat.completion.chunk", "choices": [], "usage": out["usage"]}
            ).encode()
            + b"\n\n"
        )
    yield b"data: [DONE]\n\n"
