"""The FastAPI app of the embedded server: info and health routes, error shapes, wiring.

``/health`` answers from the event loop without touching the model, so it stays fast while the
engine thread generates or a weight sync runs (a real SGLang server runs a one-token probe
there; that probe is ``/health_generate`` here, and it waits while paused as SGLang's does).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from servers.engine.sequence import Sequence
from servers.protocol import openapi_schema
from servers.protocol.auth import ApiKeyMiddleware
from servers.protocol.request import SamplingParams
from servers.routes import control as control_routes
from servers.routes import embedding as embedding_route
from servers.routes import generate as generate_route
from servers.routes import lora as lora_routes
from servers.routes import memory_occupation
from servers.routes import openai as openai_routes
from servers.routes.metrics import CONTENT_TYPE, render_metrics, server_registry
from servers.state import ServerState
from servers.weights import checker as weights_checker
from servers.weights import tensor_update

logger = logging.getLogger(__name__)
HEALTH_CHECK_TIMEOUT = 20.0
VERSION = "0.5.23-arealite-embedded"


def _error(message: str, status: int, type_: str) -> JSONResponse:
    return JSONResponse(
        {"object": "error", "message": message, "type": type_, "param": None, "code": status},
        status_code=status,
    )


def create_app(state: ServerState) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if not state.engine.alive():
            state.engine.start()
        yield
        state.shutting_down = True
        state.engine.shutdown()

    # No FastAPI OpenTelemetry hooks: the server exports its own /metrics, and the check
    # whether a tracer is configured cost ~10% of the event loop's time per /generate call.
    app = FastAPI(title="arealite embedded server (SGLang HTTP protocol)", version=VERSION,
                  lifespan=lifespan, telemetry={"tracing": False, "metrics": False, "logs": False})
    app.state.server = state
    app.include_router(generate_route.router)
    app.include_router(embedding_route.router)
    app.include_router(control_routes.router)
    app.include_router(openai_routes.router)
    app.include_router(memory_occupation.router)
    app.include_router(weights_checker.router)
    app.include_router(tensor_update.router)
    app.include_router(lora_routes.router)
    openapi_schema.install(app, state.runner.vocab_size)

    @app.exception_handler(RequestValidationError)
    async def on_validation(request: Request, exc: RequestValidationError):
        # SGLang rewrites FastAPI's 422 into its 400 ErrorResponse.
        message = str(exc)
        errors = str(exc.errors())
        if errors and errors != message:
            message = f"{message} {errors}"
        return _error(message, 400, HTTPStatus.BAD_REQUEST.phrase)

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException):
        return _error(str(exc.detail), exc.status_code, str(exc.status_code))

    @app.exception_handler(Exception)
    async def on_fault(request: Request, exc: Exception):
        logger.exception("unhandled error on %s", request.url.path)
        return _error("Internal server error", 500, "500")

    @app.get("/health")
    async def health() -> Response:
        # A live thread is not enough: a step stuck for longer than the limit (a hung kernel, a
        # runaway computation) takes the server out of its clients' rotation too.
        stalled = state.engine.stalled_for() > state.args.health_stall_timeout
        ok = state.engine.alive() and not state.shutting_down and not stalled
        return Response(status_code=200 if ok else 503)

    @app.get("/ready")
    async def ready() -> Response:
        return Response(status_code=200 if state.engine.alive() else 503)

    @app.get("/health_generate")
    async def health_generate() -> Response:
        if not state.engine.alive() or state.shutting_down:
            return Response(status_code=503)
        probe = Sequence(rid=f"HEALTH_CHECK_{uuid.uuid4().hex}", prompt=[0], internal=True,
                         params=SamplingParams(max_new_tokens=1, temperature=1.0, top_k=1))

        async def run():
            await state.wait_unpaused()
            if not state.runner.is_generation:  # a reward model: a one-token score
                await embedding_route.batcher(state).score([[0]])
                return
            await generate_route.run_sequences(state, [probe], None)

        try:
            await asyncio.wait_for(run(), timeout=HEALTH_CHECK_TIMEOUT)
        except asyncio.TimeoutError:
            if probe.on_event is not None and not probe.finished:
                state.engine.abort(probe.rid)
            return Response(status_code=503)
        return Response(status_code=200)

    def model_info() -> dict:
        cfg = state.runner.config
        return {
            "model_path": state.model_path,
            "served_model_name": state.args.served_model_name or state.model_path,
            "tokenizer_path": state.args.tokenizer_path or state.args.model_path,
            "is_generation": state.runner.is_generation,
            "preferred_sampling_params": None,
            "weight_version": state.engine.weight_version,
            "load_format": state.args.load_format,
            "reasoning_parser": None,
            "tool_call_parser": state.args.tool_call_parser,
            "disaggregation_mode": "null",
            "has_image_understanding": state.runner.vision is not None,
            "has_audio_understanding": False,
            "model_type": getattr(cfg, "model_type", None),
            "architectures": getattr(cfg, "architectures", None),
        }

    def server_info() -> dict:
        runner, eng = state.runner, state.engine
        info = state.args.resolved()
        info.update({
            "context_length": runner.context_len,
            "max_running_requests": eng.max_running,
            "launch_command": state.args.launch_command,
            "status": "ready",
            "max_total_num_tokens": eng.max_running * runner.context_len,
            "max_req_input_len": runner.context_len - 1,
            "max_context_length": runner.context_len,
            "startup_time": state.startup_time,
            "kv_events": None,
            "internal_states": [{
                "last_gen_throughput": eng.gen_throughput(), **eng.load(), **eng.stats,
                "paused": state.is_pause, "weight_version": eng.weight_version,
                "memory_released": sorted(eng.memory_released),
                "shared_weight_blocks_held_bytes": state.shared_sources.held_bytes(),
                **embedding_route.batcher_stats(state),
            }],
            "version": VERSION,
            "frontend": "python",
        })
        return info

    @app.get("/model_info")
    async def get_model_info() -> dict:
        return model_info()

    @app.get("/get_model_info", deprecated=True)
    async def get_model_info_old() -> dict:
        logger.warning("Endpoint '/get_model_info' is deprecated; use '/model_info'.")
        return model_info()

    @app.get("/server_info")
    async def get_server_info() -> dict:
        return server_info()

    @app.get("/get_server_info", deprecated=True)
    async def get_server_info_old() -> dict:
        logger.warning("Endpoint '/get_server_info' is deprecated; use '/server_info'.")
        return server_info()

    @app.get("/v1/loads")
    async def loads() -> dict:
        return {"loads": [{"dp_rank": 0, **state.engine.load()}]}

    @app.get("/get_load")
    async def get_load() -> list[dict]:
        """A per-DP-rank load list, the shape ``sglang-router`` 0.3.2 reads here: its load-aware
        policies (``power_of_two``, cache-aware balancing) sum ``num_tokens`` over the entries,
        and report -1 for a worker without this route. SGLang 0.5.23 itself reports loads on
        ``/v1/loads`` (above)."""
        load = state.engine.load()
        return [{"dp_rank": 0, "num_reqs": load["num_running_reqs"],
                 "num_waiting_reqs": load["num_queue_reqs"],
                 "num_tokens": state.engine.num_tokens()}]

    if state.args.enable_metrics:  # SGLang serves /metrics only with --enable-metrics

        registry = server_registry(state)

        @app.get("/metrics")
        async def metrics() -> Response:
            return Response(render_metrics(registry), media_type=CONTENT_TYPE)

    if state.args.api_key or state.args.admin_api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=state.args.api_key,
                           admin_api_key=state.args.admin_api_key)
    return app
