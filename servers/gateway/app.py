"""``python -m servers.gateway --servers host:port,... [--host H --port P]``: one address for a pool.

- ``/generate`` is routed round-robin to healthy servers (streams are proxied as they come);
  a server that cannot be reached is marked unhealthy and the next one is tried. ``/classify``
  and ``/encode`` (SGLang's reward-model scoring) are routed the same way: a gateway over
  ``--is-embedding`` servers is the reward-model pool's one address (its ``/generate`` is then
  the servers' 400, as a generation pool's ``/classify`` is).
- Control calls (``/pause_generation``, ``/continue_generation``, ``/update_weights_from_disk``,
  ``/update_weight_version``, ``/flush_cache``, ``/abort_request``) fan out to every server at
  once and answer ``{"success": all_ok, "results": {addr: {"status", "body"}}}``: 200 when every
  server succeeded, otherwise the common failure status or 502 when they differ.
- ``/workers`` lists (GET), adds (POST ``{"url": ...}``) and removes (DELETE
  ``/workers/{url}``) servers; the legacy ``/add_worker?url=``, ``/remove_worker?url=`` and
  ``/list_workers`` of sglang-router also work.
- ``/health`` reports ``{"healthy": h, "total": n}`` (503 when none is healthy).
- ``/metrics``: Prometheus text of its workers' health and the calls it routed (``servers.gateway.metrics``).
- Keys (``--api-key`` / ``--admin-api-key``, or ``AREALITE_API_KEY`` / ``AREALITE_ADMIN_API_KEY``)
  guard the gateway's own routes with the servers' rules (``servers.protocol.auth``): admin endpoints and
  worker-list changes (``POST /workers``, ``DELETE /workers/...``, ``/add_worker``,
  ``/remove_worker``) need the admin key, everything else but ``/health*`` the api key. The
  caller's ``Authorization`` is forwarded to the servers, which check it again.
One ``curl`` moves a whole pool to new weights (docs/servers.md)::

    curl -X POST localhost:8000/update_weights_from_disk -d '{"model_path": "/ckpt/v3", "weight_version": "3"}'
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os

import aiohttp
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from servers.gateway.metrics import gateway_registry
from servers.gateway.workers import Gateway, Worker, normalize_url
from servers.protocol import openapi_schema
from servers.protocol.auth import ADMIN_PATHS, ApiKeyMiddleware
from servers.routes.metrics import CONTENT_TYPE, render_metrics
from servers.server_args import ADMIN_API_KEY_ENV, API_KEY_ENV, INSECURE_HELP, check_bind

logger = logging.getLogger(__name__)

# routed to one worker each: generation, and SGLang's reward-model scoring (the same
# EmbeddingReqInput on both scoring routes), for a gateway over --is-embedding servers
ROUTED = ("/generate", "/classify", "/encode")
FANOUT = ("/pause_generation", "/continue_generation", "/update_weights_from_disk",
          "/update_weight_version", "/flush_cache", "/abort_request", "/weights_checker")
WORKER_ADMIN_PATHS = frozenset({"/add_worker", "/remove_worker"})


def is_gateway_admin(method: str, path: str) -> bool:
    """Admin routes of the gateway: the servers' admin endpoints it fans out, plus every change
    to the worker list (listing it needs only the api key)."""
    if path in ADMIN_PATHS or path in WORKER_ADMIN_PATHS:
        return True
    return method != "GET" and (path == "/workers" or path.startswith("/workers/"))


def _fwd_headers(request: Request) -> dict:
    h = {"Content-Type": "application/json"}
    if "authorization" in request.headers:
        h["Authorization"] = request.headers["authorization"]
    return h


def create_app(gw: Gateway) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        gw.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=gw.request_timeout))
        task = asyncio.create_task(gw.health_loop())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await gw.session.close()

    app = FastAPI(title="arealite gateway", lifespan=lifespan)

    @app.get("/health")
    async def health() -> JSONResponse:
        h = gw.answering()
        return JSONResponse({"healthy": h, "total": len(gw.workers)}, status_code=200 if h else 503)

    registry = gateway_registry(gw)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(render_metrics(registry), media_type=CONTENT_TYPE)

    @app.get("/readiness")
    async def readiness() -> JSONResponse:
        h = len(gw.healthy())
        body = {"status": "ready" if h else "not ready", "healthy_workers": h,
                "total_workers": len(gw.workers)}
        return JSONResponse(body, status_code=200 if h else 503)

    async def route(path: str, request: Request) -> Response:
        """One call to one healthy worker, round-robin; an unreachable worker is marked
        unhealthy and the next is tried; the worker's answer (a 4xx too) is the caller's."""
        body = await request.body()
        try:
            stream = path == "/generate" and bool(json.loads(body or b"{}").get("stream"))
        except (ValueError, AttributeError):
            stream = False
        for w in gw.pick_order():
            w.sent += 1
            try:
                resp = await gw.session.post(f"{w.url}{path}", data=body,
                                             headers=_fwd_headers(request))
            except aiohttp.ClientError as e:
                logger.warning("worker %s unreachable: %s", w.url, e)
                w.unreachable += 1
                w.healthy = False
                continue
            if stream and resp.status == 200:
                async def relay(resp=resp):
                    try:
                        async for chunk in resp.content.iter_any():
                            yield chunk
                    finally:
                        resp.release()
                return StreamingResponse(relay(), media_type="text/event-stream")
            data = await resp.read()
            resp.release()
            return Response(data, status_code=resp.status,
                            media_type=resp.headers.get("Content-Type", "application/json"))
        gw.no_worker += 1
        return JSONResponse({"error": {"message": "no healthy server in the pool"}}, status_code=503)

    def routed(path: str):
        async def handler(request: Request) -> Response:  # path is bound, not a parameter
            return await route(path, request)
        return handler

    for path in ROUTED:
        app.add_api_route(path, routed(path), methods=["POST", "PUT"], name=path.strip("/"))

    async def fan_out(path: str, request: Request) -> JSONResponse:
        body = await request.body()
        gw.fanouts[path] = gw.fanouts.get(path, 0) + 1
        query = request.url.query

        async def one(w: Worker):
            url = f"{w.url}{path}" + (f"?{query}" if query else "")
            try:
                async with gw.session.request(request.method, url, data=body or None,
                                              headers=_fwd_headers(request)) as r:
                    text = await r.text()
                    try:
                        payload = json.loads(text) if text else None
                    except ValueError:
                        payload = text
                    return w.url, {"status": r.status, "body": payload}
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                return w.url, {"status": 502, "body": f"unreachable: {e}"}

        results = dict(await asyncio.gather(*(one(w) for w in list(gw.workers.values()))))
        statuses = [r["status"] for r in results.values()]
        ok = bool(results) and set(statuses) == {200}
        if not results:
            status = 503
        elif ok:
            status = 200
        elif 502 in statuses:
            status = 502  # a worker could not be reached: the gateway's failure
        else:  # every worker answered; the first refusal is the caller's answer
            status = next(s for s in statuses if s != 200)
        return JSONResponse({"success": ok, "results": results}, status_code=status)

    def fan_out_route(path: str):
        async def handler(request: Request) -> JSONResponse:  # path is bound, not a parameter
            return await fan_out(path, request)
        return handler

    for path in FANOUT:
        methods = ["GET", "POST"] if path == "/flush_cache" else ["POST"]
        app.add_api_route(path, fan_out_route(path), methods=methods, name=path.strip("/"))

    async def proxy_first(path: str, request: Request) -> Response:
        for w in gw.pick_order():
            try:
                async with gw.session.get(f"{w.url}{path}", headers=_fwd_headers(request)) as r:
                    return Response(await r.read(), status_code=r.status,
                                    media_type=r.headers.get("Content-Type"))
            except aiohttp.ClientError:
                w.healthy = False
        return JSONResponse({"error": {"message": "no healthy server in the pool"}}, status_code=503)

    def info_route(path: str):
        async def info(request: Request) -> Response:
            return await proxy_first(path, request)
        return info

    for path in ("/model_info", "/get_model_info", "/server_info", "/get_server_info"):
        app.add_api_route(path, info_route(path), methods=["GET"], name=path.strip("/"))

    def listing() -> dict:
        return {"workers": [w.as_dict() for w in gw.workers.values()], "total": len(gw.workers)}

    @app.get("/workers")
    async def list_workers() -> dict:
        return listing()

    @app.post("/workers")
    async def add_worker(request: Request) -> JSONResponse:
        try:
            body = await request.json()
            w = gw.add(body["url"])
        except (ValueError, KeyError, TypeError, AttributeError):
            return JSONResponse({"error": {"message": 'body must be {"url": "host:port"}'}},
                                status_code=400)
        await gw.check(w)
        return JSONResponse({"status": "accepted", "worker": w.as_dict()}, status_code=202)

    def bad_url(e: ValueError) -> JSONResponse:
        return JSONResponse({"error": {"message": str(e)}}, status_code=400)

    @app.delete("/workers/{url:path}")
    async def delete_worker(url: str) -> JSONResponse:
        try:
            removed = gw.remove(url)
        except ValueError as e:
            return bad_url(e)
        if not removed:
            return JSONResponse({"error": {"message": f"unknown worker {url}"}}, status_code=404)
        return JSONResponse({"status": "removed", "url": normalize_url(url)})

    @app.post("/add_worker")
    async def add_worker_legacy(url: str) -> JSONResponse:
        try:
            w = gw.add(url)
        except ValueError as e:
            return bad_url(e)
        await gw.check(w)
        return JSONResponse({"status": "added", "worker": w.as_dict()})

    @app.post("/remove_worker")
    async def remove_worker_legacy(url: str) -> JSONResponse:
        try:
            removed = gw.remove(url)
        except ValueError as e:
            return bad_url(e)
        if not removed:
            return JSONResponse({"error": {"message": f"unknown worker {url}"}}, status_code=404)
        return JSONResponse({"status": "removed"})

    @app.get("/list_workers")
    async def list_workers_legacy() -> dict:
        return {"urls": [w.url for w in gw.workers.values()]}

    openapi_schema.install(app, None)  # token ids unbounded: the gateway knows no model
    if gw.api_key or gw.admin_api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=gw.api_key, admin_api_key=gw.admin_api_key,
                           is_admin=is_gateway_admin)
    return app


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    p = argparse.ArgumentParser(prog="python -m servers.gateway", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--servers", default="", help="comma-separated host:port list (may be empty)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--health-check-interval", type=float, default=5.0)
    p.add_argument("--health-failure-threshold", type=int, default=3)
    p.add_argument("--log-level", default="info")
    p.add_argument("--api-key", default=None, help=f"default: ${API_KEY_ENV}")
    p.add_argument("--admin-api-key", default=None, help=f"default: ${ADMIN_API_KEY_ENV}")
    p.add_argument("--insecure", action="store_true", help=INSECURE_HELP)
    args = p.parse_args(argv)
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    admin_api_key = args.admin_api_key or os.environ.get(ADMIN_API_KEY_ENV) or None
    check_bind(p, args.host, args.insecure, api_key, admin_api_key)
    urls = [u for u in args.servers.split(",") if u.strip()]
    gw = Gateway(urls, health_interval=args.health_check_interval,
                 failure_threshold=args.health_failure_threshold,
                 api_key=api_key, admin_api_key=admin_api_key)
    logging.basicConfig(level=getattr(logging, args.log_level.upper()))
    uvicorn.run(create_app(gw), host=args.host, port=args.port, log_level=args.log_level)
    return 0

