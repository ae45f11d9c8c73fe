"""Schema-driven fuzzing of the embedded server and the gateway: never a 5xx, still correct after.

Two embedded servers (tiny model, 48-token context) and a gateway over them. For each app,
schemathesis generates requests from the app's own OpenAPI schema (``sampling_params`` typed
field by field, so most ``/generate`` bodies reach the engine) and sends them, operation by
operation; ``/generate`` gets the largest share. Calls that hold generation by design
(``/pause_generation``, ``/release_memory_occupation``) are each followed by the call that
releases it. ``/init_weights_update_group`` waits in a TCP rendezvous for
``--weight-group-timeout`` (2 s here), so it gets few examples. The gateway's calls that add or
remove workers are left out: they would dial the generated addresses.

Afterwards every server must answer ``/health`` and give the same greedy tokens as before.
Prints requests and status codes per operation, and exits 1 on any response >= 500.

    python -m tests.support.fuzz_servers                  # 10,000 requests per app
    python -m tests.support.fuzz_servers --requests 400   # what the test suite runs
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time

import requests

from benchmarks.harness.server_process import Server

SERVER_ARGS = ("--context-length", "48", "--weight-group-timeout", "2", "--random-seed", "0")
RELEASE = {"/pause_generation": ("/continue_generation", {}),
           "/release_memory_occupation": ("/resume_memory_occupation", {})}
FEW = {"/init_weights_update_group": 5}  # each waits out a 2 s rendezvous
# The gateway's worker list: a generated address would be dialled (health check, fan-out), and
# nothing here may send traffic off this machine. tests/servers/gateway/test_gateway_urls.py checks
# that bad addresses are refused.
SKIP = {"/workers", "/workers/{url}", "/add_worker", "/remove_worker"}
GREEDY = {"input_ids": [3, 4, 5], "sampling_params": {"max_new_tokens": 8, "temperature": 0,
                                                      "ignore_eos": True}}


def greedy_tokens(addr: str) -> list[int]:
    r = requests.post(f"http://{addr}/generate", json=GREEDY, timeout=60)
    r.raise_for_status()
    return r.json()["output_ids"]


def fuzz_app(base: str, total: int, release_on: list[str], seed: int) -> dict:
    """Send about ``total`` generated requests to the app at ``base``; returns the tallies."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed

    schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
    ops = [op for op in (r.ok() for r in schema.get_all_operations())
           if not (op.path in SKIP and op.method.upper() != "GET")]
    gen_share = 0.4 if any(op.path == "/generate" for op in ops) else 0.0
    rest = max(1, len(ops) - (1 if gen_share else 0))
    session = requests.Session()
    tally: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    failures: list[str] = []
    def runner(op, key: str, n: int, run_seed: int):
        @hseed(run_seed)
        @settings(max_examples=max(n, 1), deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=op.as_strategy())
        def check(case):
            resp = case.call(base_url=base, session=session, timeout=60)
            tally[key][resp.status_code] += 1
            if resp.status_code >= 500:
                failures.append(f"{key} {case.body!r} -> {resp.status_code} {resp.text[:300]}")
            if op.path in RELEASE:
                path, body = RELEASE[op.path]
                for target in release_on:
                    session.post(f"{target}{path}", json=body, timeout=60)

        return check

    for op in ops:
        key = f"{op.method.upper()} {op.path}"
        n = int(total * gen_share) if op.path == "/generate" else int(total * (1 - gen_share) / rest)
        n = min(n, FEW.get(op.path, n))
        # hypothesis may stop short of max_examples (a small input space, rejected draws): run
        # again with the next seed until this operation got its share
        for run in range(50):
            done = sum(tally[key].values())
            if done >= n:
                break
            runner(op, key, n - done, seed * 1000 + run)()
    # operations with a small input space saturate early; /generate makes up the difference
    gen = [op for op in ops if op.path == "/generate" and op.method.upper() == "POST"]
    for run in range(50):
        short = total - sum(sum(v.values()) for v in tally.values())
        if short <= 0 or not gen:
            break
        key = f"POST {gen[0].path}"
        runner(gen[0], key, short, seed * 1000 + 500 + run)()
    return {"tally": {k: dict(v) for k, v in tally.items()}, "failures": failures,
            "requests": sum(sum(v.values()) for v in tally.values())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--requests", type=int, default=10_000, help="generated requests per app")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model-path", default=None, help="HF model dir (default: the tiny model)")
    p.add_argument("--json", default=None, help="also write the figures here")
    args = p.parse_args(argv)
    model = args.model_path
    if model is None:
        from arealite.demo.tiny import build_tiny_model

        model = str(build_tiny_model(tempfile.mkdtemp(prefix="fuzz_tiny_")))
    report: dict = {}
    with Server(model, *SERVER_ARGS) as a, Server(model, *SERVER_ARGS) as b:
        servers = [f"http://{a.addr}", f"http://{b.addr}"]
        before = [greedy_tokens(s.addr) for s in (a, b)]
        with Server(None, "--servers", f"{a.addr},{b.addr}", module="servers.gateway") as gw:
            for name, base in (("server", servers[0]), ("gateway", f"http://{gw.addr}")):
                t0 = time.monotonic()
                res = fuzz_app(base, args.requests, servers, args.seed)
                res["seconds"] = round(time.monotonic() - t0, 1)
                report[name] = res
        health = [requests.get(f"{s}/health", timeout=30).status_code for s in servers]
        after = [greedy_tokens(s.addr) for s in (a, b)]
    report["health_after"] = health
    report["same_greedy_tokens_after"] = after == before
    for name in ("server", "gateway"):
        res = report[name]
        fives = sum(c for t in res["tally"].values() for s, c in t.items() if s >= 500)
        print(f"{name}: {res['requests']} requests in {res['seconds']} s, responses >= 500: {fives}")
        for key, counts in sorted(res["tally"].items()):
            print(f"  {key:45s} " + " ".join(f"{s}:{c}" for s, c in sorted(counts.items())))
        for f in res["failures"][:10]:
            print("  5xx:", f)
    print(f"after: /health {health}, same greedy tokens as before: {after == before}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    bad = any(report[n]["failures"] for n in ("server", "gateway"))
    return 1 if bad or health != [200, 200] or after != before else 0


if __name__ == "__main__":
    sys.exit(main())
