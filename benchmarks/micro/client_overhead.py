"""Client overhead: requests/s through ``RemoteInferenceEngine.agenerate`` versus raw ``aiohttp``
posts of the same ``/generate`` bodies, against a minimal loopback server (a separate process)
that answers every request with one fixed SGLang-shaped reply. Both clients run in one process,
on the same event loop (the engine's), with the same concurrency, in alternating rounds; the
raw client also reads and JSON-decodes each body, as any client must. On top of that the engine
validates the request, builds the body, routes (sticky LRU, in-flight counts), time-boxes the
call and turns the reply into per-token lists of ids, logprobs and versions.

The raw client posts ``json=body`` (aiohttp runs ``json.dumps``); the engine formats the same
JSON value itself (``encode_generate_body``), which costs less than ``json.dumps`` on a short
body, so part of what it saves there pays for its bookkeeping. Both are what a client of each
kind does; the ratio is the cost of using the engine instead of hand-written posts.

    python -m benchmarks.micro.client_overhead [--quick] [--requests N] [--concurrency C] [--tokens T]
                                         [--metrics] [--trace]

``--metrics`` serves the trainer's Prometheus /metrics (live client numbers included) and
scrapes it every 0.2 s while the rounds run; ``--trace`` turns the timeline trace on, every
request seen by its observer's hooks (docs/observability.md).

Prints both rates and the ratio raw/engine (target <= 1.15), plus the client process's CPU
time per request for each (less sensitive to other load on a shared machine).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import time

from arealite.utils.network import LOOPBACK, find_free_port, wait_http_ok


def fixed_reply(n_tokens: int) -> bytes:
    ids = [(17 + i) % 300 for i in range(n_tokens)]
    return json.dumps({
        "text": "x" * n_tokens,
        "output_ids": ids,
        "meta_info": {
            "id": "bench", "finish_reason": {"type": "length", "length": n_tokens},
            "prompt_tokens": 32, "completion_tokens": n_tokens, "cached_tokens": 0,
            "weight_version": "0", "weight_versions": [{"version": "0", "start": 0, "end": n_tokens}],
            "output_token_logprobs": [[-0.5, t, None] for t in ids], "e2e_latency": 0.001,
        },
    }).encode()


def serve(port: int, n_tokens: int) -> None:
    from aiohttp import web

    body = fixed_reply(n_tokens)

    async def generate(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=body, content_type="application/json")

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="")

    app = web.Application()
    app.router.add_post("/generate", generate)
    app.router.add_get("/health", health)
    web.run_app(app, host=LOOPBACK, port=port, print=None, access_log=None)


async def run_raw(url: str, body: dict, n: int, conc: int) -> float:
    from arealite.utils.http import make_session

    async with make_session() as session:
        async def worker(k: int) -> None:
            for _ in range(k):
                async with session.post(url, json=body) as resp:
                    json.loads(await resp.read())

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(n // conc) for _ in range(conc)))
        return (n // conc) * conc / (time.perf_counter() - t0)


async def run_engine(engine, prompt: list[int], n_tokens: int, n: int, conc: int) -> float:
    from arealite.api.config.rollout import GenerationHyperparameters
    from arealite.api.io_struct import ModelRequest

    g = GenerationHyperparameters(max_new_tokens=n_tokens)

    async def worker(w: int, k: int) -> None:
        for i in range(k):
            r = await engine.agenerate(ModelRequest(rid=f"b{w}-{i}", input_ids=prompt, gconfig=g))
            assert r.output_len == n_tokens

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w, n // conc) for w in range(conc)))
    return (n // conc) * conc / (time.perf_counter() - t0)


def observed(engine, metrics: bool, trace_on: bool):
    """(the client the rounds call, a function that stops what was started)."""
    import tempfile
    import threading
    import urllib.request

    client, stops = engine, []
    if metrics:
        from arealite.api.config.run import StatsLoggerConfig
        from arealite.observe.prometheus_metrics import start_trainer_metrics

        m = start_trainer_metrics(StatsLoggerConfig(metrics_port=0), 0, engine)
        url = f"http://{LOOPBACK}:{m.server.server_port}/metrics"
        done = threading.Event()

        def scrape() -> None:
            while not done.wait(0.2):
                with urllib.request.urlopen(url, timeout=5) as r:
                    r.read()

        t = threading.Thread(target=scrape, daemon=True)
        t.start()
        stops += [done.set, m.server.shutdown]
    if trace_on:
        from arealite.observe import trace
        from arealite.observe.rollout_trace import RolloutTrace

        trace.start(tempfile.mkdtemp(prefix="client-overhead-") + "/trace.json")
        engine.set_observer(RolloutTrace())
        stops += [lambda: engine.set_observer(None), trace.stop]
    return client, lambda: [f() for f in stops]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer requests (a few seconds)")
    ap.add_argument("--requests", type=int, default=None, help="requests per round")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64, help="output tokens in the fixed reply")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--metrics", action="store_true", help="trainer /metrics on, scraped every 0.2 s")
    ap.add_argument("--trace", action="store_true", help="the timeline trace on")
    ap.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve is not None:
        serve(args.serve, args.tokens)
        return
    n = args.requests or (500 if args.quick else 2000)
    rounds = args.rounds or (5 if args.quick else 15)

    from arealite.api.config.rollout import InferenceEngineConfig
    from arealite.backends.sglang import generate_payload
    from arealite.rollout.remote_engine import RemoteInferenceEngine

    port = find_free_port()
    srv = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.micro.client_overhead", "--serve", str(port), "--tokens", str(args.tokens)],
        start_new_session=True,
    )
    engine = None
    try:
        if not wait_http_ok(f"http://{LOOPBACK}:{port}/health", 30, alive=lambda: srv.poll() is None):
            raise SystemExit("the loopback server did not start")
        engine = RemoteInferenceEngine(InferenceEngineConfig(setup_timeout=10))
        engine.initialize([f"{LOOPBACK}:{port}"])
        client, stop_observers = observed(engine, args.metrics, args.trace)
        prompt = list(range(1, 33))
        from arealite.api.config.rollout import GenerationHyperparameters

        body = generate_payload(prompt, GenerationHyperparameters(max_new_tokens=args.tokens), args.tokens, "raw")
        url = f"http://{LOOPBACK}:{port}/generate"
        run = engine.executor.run_coroutine  # both clients on the engine's loop
        run(run_raw(url, body, 64, 8)).result(60)  # warm-up: connections, caches
        run(run_engine(client, prompt, args.tokens, 64, 8)).result(60)
        raw, eng, raw_cpu, eng_cpu = [], [], [], []
        for _ in range(rounds):  # alternating, so background load hits both alike
            for rates, cpus, coro in (
                (raw, raw_cpu, lambda: run_raw(url, body, n, args.concurrency)),
                (eng, eng_cpu, lambda: run_engine(client, prompt, args.tokens, n, args.concurrency)),
            ):
                c0 = time.process_time()
                rates.append(run(coro()).result(600))
                cpus.append((time.process_time() - c0) / n * 1e6)
        r, e = statistics.median(raw), statistics.median(eng)
        rc, ec = statistics.median(raw_cpu), statistics.median(eng_cpu)
        stop_observers()
        on = [x for x, flag in (("metrics", args.metrics), ("trace", args.trace)) if flag]
        print(f"client_overhead: {n} requests x {rounds} rounds, concurrency {args.concurrency}, "
              f"{args.tokens} output tokens per reply (medians over rounds); "
              f"observability on: {', '.join(on) or 'none'}")
        print(f"  raw aiohttp posts        : {r:8.1f} req/s  {rc:6.1f} us client CPU/request")
        print(f"  RemoteInferenceEngine       : {e:8.1f} req/s  {ec:6.1f} us client CPU/request")
        print(f"  overhead ratio raw/engine: {r / e:8.3f}x  (target <= 1.15); client CPU ratio "
              f"{ec / rc:.3f}x")
    finally:
        if engine is not None:
            engine.destroy()
        try:
            os.killpg(srv.pid, signal.SIGTERM)
            srv.wait(5)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(srv.pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
