"""The Tinker HTTP API (the routes the official ``tinker`` SDK calls, read from its source:
``tinker/resources/*.py`` and ``tinker/lib/internal_client_holder.py``), over
``arealite.tinker.service``.

Bodies are validated with the SDK's own request models (``tinker.types``), so a request the
SDK would not send is a 400 naming the field; ``forward_backward`` arrives as the SDK's
protobuf. Errors answer ``{"error": message, "category": "user" | "server"}`` (the SDK's
``RequestFailedResponse``) with the status the SDK maps to its exception classes (400
``BadRequestError``, 401 ``AuthenticationError``, 404 ``NotFoundError``) and
``x-should-retry: false`` so a bad request is not retried.

Auth: the API key (``config.api_key``, else ``AREALITE_TINKER_API_KEY``) is checked the way
arealite's servers check theirs (``servers/protocol/auth.py``): constant-time comparison, a 401
``{"error": "Unauthorized"}``, health probes open. The SDK sends it as ``X-API-Key``; a
``Authorization: Bearer`` header is accepted too.
"""

from __future__ import annotations

import secrets
from typing import Any

import pydantic
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import Headers
from tinker import types as tt

from arealite.tinker.futures import Futures, UserError
from arealite.tinker.service import TinkerService
from arealite.tinker.wire import PROTO_CONTENT_TYPE, WireError, decode_forward_backward

OPEN_PATHS = ("/api/v1/healthz",)


def error(status: int, message: str, category: str = "user") -> JSONResponse:
    return JSONResponse({"error": message, "category": category}, status_code=status,
                        headers={"x-should-retry": "false"})


def key_ok(headers: Any, expected: str) -> bool:
    got = headers.get("x-api-key")
    if got is None:
        auth = headers.get("authorization") or ""
        scheme, _, rest = auth.partition(" ")
        got = rest if scheme.lower() == "bearer" else None
    return got is not None and secrets.compare_digest(got.encode(), expected.encode())


class KeyGuard:
    """The API key check as plain ASGI middleware (Starlette's ``BaseHTTPMiddleware`` runs each
    request in a task group with memory streams: about a third of this service's own CPU time
    per ``forward_backward`` when measured with py-spy)."""

    def __init__(self, app: Any, api_key: str) -> None:
        self.app = app
        self.api_key = api_key

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if (scope["type"] == "http" and scope["path"] not in OPEN_PATHS
                and not key_ok(Headers(scope=scope), self.api_key)):
            await JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)
            return
        await self.app(scope, receive, send)


async def _json(request: Request, model: type[pydantic.BaseModel]) -> Any:
    try:
        return model.model_validate(await request.json())
    except pydantic.ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UserError(f"{model.__name__}: {where}: {first['msg']}") from None
    except ValueError as e:  # not JSON at all
        raise UserError(f"{model.__name__}: body is not JSON ({e})") from None


def _future(futures: Futures, rid: str, model_id: str | None = None, **extra: Any
            ) -> dict[str, Any]:
    return {"request_id": rid, "model_id": model_id, **extra}


def build_app(svc: TinkerService, api_key: str | None) -> FastAPI:
    app = FastAPI(title="arealite Tinker service")
    fut = svc.futures

    if api_key:
        app.add_middleware(KeyGuard, api_key=api_key)

    @app.exception_handler(UserError)
    async def user_error(request: Request, e: UserError):
        return error(404 if str(e).startswith("unknown ") else 400, str(e))

    @app.get("/api/v1/healthz")
    async def healthz():
        return {"status": "ok"}

    @app.post("/api/v1/client/config")
    async def client_config():
        # the flags this server supports: API keys (no JWT exchange), httpx's transport, plain
        # protobuf bodies, per-request futures, custom losses on the client
        return {"pjwt_auth_enabled": False, "use_pyqwest_transport": False,
                "proto_compress_fwdbwd": False, "parallel_fwdbwd_chunks": False,
                "sample_use_retrieve_futures": False, "custom_loss_server_side": False,
                "sample_join_sampling_session": False}

    @app.post("/api/v1/client/dynamic_config")
    async def dynamic_config():
        return {"sample_cancel_enabled": False}

    @app.post("/api/v1/telemetry")
    async def telemetry():
        return {"status": "accepted"}

    @app.get("/api/v1/get_server_capabilities")
    async def capabilities():
        return svc.capabilities()

    @app.post("/api/v1/create_session")
    async def create_session(request: Request):
        await _json(request, tt.CreateSessionRequest)
        return {"type": "create_session", "session_id": svc.new_session()}

    @app.post("/api/v1/session_heartbeat")
    async def heartbeat(request: Request):
        req = await _json(request, tt.SessionHeartbeatRequest)
        if req.session_id not in svc.sessions:
            return error(410, f"session {req.session_id} is finished or unknown")
        return {"type": "session_heartbeat"}

    @app.post("/api/v1/sessions/{session_id}/finish")
    async def finish(session_id: str):
        svc.sessions.discard(session_id)
        return {}

    @app.post("/api/v1/create_model")
    async def create_model(request: Request):
        req = await _json(request, tt.CreateModelRequest)
        if req.optimizer_config.type != "adamw":
            raise UserError(f"optimizer {req.optimizer_config.type!r}: only adamw is served")
        lora = req.lora_config.model_dump() if req.lora_config is not None else None
        rid = fut.submit("create", svc.create_model, req.session_id, req.base_model, lora)
        return _future(fut, rid)

    @app.post("/api/v1/get_info")
    async def get_info(request: Request):
        req = await _json(request, tt.GetInfoRequest)
        return svc.info(req.model_id)

    @app.post("/api/v1/forward_backward")
    async def forward_backward(request: Request):
        if request.headers.get("content-encoding"):
            raise UserError("compressed bodies are not accepted (client config says so)")
        try:
            req = decode_forward_backward(await request.body())
        except WireError as e:
            raise UserError(str(e)) from None
        svc.entry(req.model_id)
        rid = fut.submit("fwdbwd", svc.forward_backward, req)
        return _future(fut, rid, req.model_id)

    @app.post("/api/v1/optim_step")
    async def optim_step(request: Request):
        body = await request.json()
        req = await _json(request, tt.OptimStepRequest)
        svc.entry(req.model_id)
        params = body.get("adam_params") or body.get("optim_params") or body.get(
            "optimizer_params") or {}
        rid = fut.submit("optim", svc.optim_step, req.model_id, params)
        return _future(fut, rid, req.model_id)

    @app.post("/api/v1/save_weights")
    async def save_weights(request: Request):
        req = await _json(request, tt.SaveWeightsRequest)
        svc.entry(req.model_id)
        rid = fut.submit("save", svc.save_state, req.model_id, req.path)
        return _future(fut, rid, req.model_id)

    @app.post("/api/v1/load_weights")
    async def load_weights(request: Request):
        req = await _json(request, tt.LoadWeightsRequest)
        if req.model_id is None:
            raise UserError("load_weights without model_id (create-from-state) is not served; "
                            "create a training client, then load_state")
        svc.entry(req.model_id)
        rid = fut.submit("load", svc.load_state, req.model_id, req.path, req.optimizer)
        return _future(fut, rid, req.model_id)

    @app.post("/api/v1/save_weights_for_sampler")
    async def save_for_sampler(request: Request):
        req = await _json(request, tt.SaveWeightsForSamplerRequest)
        svc.entry(req.model_id)
        rid = fut.submit("sampler", svc.save_for_sampler, req.model_id, req.path,
                         req.sampling_session_seq_id)
        return _future(fut, rid, req.model_id)

    @app.post("/api/v1/create_sampling_session")
    async def create_sampling_session(request: Request):
        req = await _json(request, tt.CreateSamplingSessionRequest)
        sid = svc.create_sampling_session(req.session_id, req.model_path, req.base_model)
        return {"type": "create_sampling_session", "sampling_session_id": sid}

    @app.post("/api/v1/join_sampling_session")
    async def join(request: Request):
        req = await _json(request, tt.JoinSamplingSessionRequest)
        return {"type": "join_sampling_session",
                "client_counter": svc.join(req.sampling_session_id)}

    @app.get("/api/v1/samplers/{sampler_id}")
    async def get_sampler(sampler_id: str):
        s = svc.sampler_session(sampler_id)
        return {"sampler_id": s.session_id, "base_model": s.base_model,
                "model_path": s.model_path}

    @app.post("/api/v1/asample")
    async def asample(request: Request):
        req = await _json(request, tt.SampleRequest)
        if req.sampling_session_id:
            sess = svc.sampler_session(req.sampling_session_id)
        else:  # a one-off request naming its weights
            sess = svc.sampler_session(svc.create_sampling_session(
                next(iter(svc.sessions), ""), req.model_path, req.base_model))
        unsupported = [k for k in ("topk_prompt_logprobs", "topk_sample_logprobs",
                                   "prompt_alt_tokens_k") if getattr(req, k)]
        if req.target_prompt_logprobs is not None or req.prompt_logprobs_last_n is not None:
            unsupported.append("target_prompt_logprobs/prompt_logprobs_last_n")
        if unsupported:
            raise UserError(f"not served here: {', '.join(unsupported)}")
        prompt = [t for c in req.prompt.chunks for t in _tokens(c)]
        rid = fut.submit("sample", svc.sample, sess, prompt, req.num_samples,
                         req.sampling_params.model_dump(), bool(req.prompt_logprobs))
        return _future(fut, rid, sample_sequence_ids=[f"{rid}-{i}"
                                                      for i in range(req.num_samples)])

    @app.post("/api/v1/retrieve_future")
    async def retrieve(request: Request):
        req = await _json(request, tt.FutureRetrieveRequest)
        if not fut.known(req.request_id):
            return error(404, f"unknown request_id {req.request_id!r}")
        out = await fut.wait(req.request_id, svc.config.retrieve_wait)
        if out is None:
            return {"type": "try_again", "request_id": req.request_id, "queue_state": "active"}
        if out.error is not None:
            return {"error": out.error, "category": out.category}
        if out.proto is not None:
            return Response(out.proto, media_type=PROTO_CONTENT_TYPE)
        return out.json

    return app


def _tokens(chunk: Any) -> list[int]:
    if getattr(chunk, "type", None) != "encoded_text":
        raise UserError(f"{getattr(chunk, 'type', chunk)!r} chunks are not served (text only)")
    return list(chunk.tokens)
