"""A scripted server with SGLang's HTTP shapes, for the client's failure paths only.

The real behaviour tests (generation, pauses, weight updates, killed servers) run against our
embedded servers in ``tests/rollout/test_remote_engine_integration.py``. What a real server
cannot be made to do on demand - answer 503, send each error shape, abort before prefill, be
slow to load weights, lose a request mid-bucket - is scripted here. Every call is recorded in
``calls`` as ``(path, json_body)``.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from arealite.utils.network import LOOPBACK, find_free_port

Reply = tuple[int, Any]


def generate_reply(
    body: dict, n: int | None = None, version: str = "0", finish: dict | None = None,
    spans: list | None = None,
) -> Reply:
    """A 200 /generate answer: token i is ``(last input id + i + 1) % 97``, logprob -0.01·(i+1)."""
    sp = body.get("sampling_params", {})
    n = sp.get("max_new_tokens", 16) if n is None else n
    last = body["input_ids"][-1]
    ids = [(last + i + 1) % 97 for i in range(n)]
    meta = {
        "id": body.get("rid", "x"),
        "finish_reason": finish or {"type": "length", "length": n},
        "prompt_tokens": len(body["input_ids"]),
        "completion_tokens": n,
        "cached_tokens": 0,
        "weight_version": version,
        "output_token_logprobs": [[-0.01 * (i + 1), t, None] for i, t in enumerate(ids)],
    }
    if spans is not None:
        meta["weight_versions"] = spans
    return 200, {"text": "", "output_ids": ids, "meta_info": meta}


class ScriptedServer:
    """Runs on its own thread and loop. ``on_generate(body, call_index) -> (status, body)``
    and ``on_control[path](body) -> (status, body)`` override the defaults."""

    def __init__(self, tp_size: int = 1, version: str = "0", begin_404: bool = False):
        self.port = find_free_port()
        self.addr = f"{LOOPBACK}:{self.port}"
        self.tp_size = tp_size
        self.version = version
        self.begin_404 = begin_404
        self.calls: list[tuple[str, Any, float]] = []
        self.on_generate: Callable[[dict, int], Reply] | None = None
        self.on_control: dict[str, Callable[[dict], Reply]] = {}
        self.health_status = 200
        self._n_generate = 0
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> ScriptedServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)  # do not wait on hung handlers
        await self._runner.setup()
        await web.TCPSite(self._runner, LOOPBACK, self.port).start()

    def stop(self) -> None:
        """Close the listening socket and every connection (like a killed process)."""
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
            self._runner = None

    def restart(self) -> None:
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)

    def close(self) -> None:
        self.stop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def paths(self) -> list[str]:
        return [p for p, _, _ in self.calls]

    def bodies(self, path: str) -> list[Any]:
        return [b for p, b, _ in self.calls if p == path]

    # ---------------------------------------------------------------- handlers

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = "/" + request.match_info["path"]
        raw = await request.read()
        body = json.loads(raw) if raw else None
        self.calls.append((path, body, time.monotonic()))
        status, out = await self._dispatch(path, body or {})
        if isinstance(out, str):
            return web.Response(status=status, text=out)
        return web.json_response(out, status=status)

    async def _dispatch(self, path: str, body: dict) -> Reply:
        if path == "/generate":
            i = self._n_generate
            self._n_generate += 1
            if self.on_generate is not None:
                res = self.on_generate(body, i)
                return await res if asyncio.iscoroutine(res) else res
            return generate_reply(body, version=self.version)
        if path in self.on_control:
            res = self.on_control[path](body)
            return await res if asyncio.iscoroutine(res) else res
        if path == "/health":
            return self.health_status, ""
        if path in ("/server_info", "/get_server_info"):
            return 200, {"tp_size": self.tp_size, "dp_size": 1, "device": "cpu", "model_path": "m"}
        if path in ("/model_info", "/get_model_info"):
            return 200, {"weight_version": self.version, "model_path": "m", "is_generation": True}
        if path == "/begin_weight_update" and self.begin_404:
            return 404, {"detail": "Not Found"}
        if path in ("/update_weights_from_disk", "/update_weights_from_distributed"):
            if body.get("weight_version") is not None:
                self.version = body["weight_version"]
            return 200, {"success": True, "message": "ok", "num_paused_requests": 0}
        if path in ("/pause_generation", "/continue_generation"):
            return 200, {"message": "ok", "status": "ok"}
        return 200, {"success": True, "message": "ok"}
