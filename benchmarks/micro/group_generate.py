"""One rollout batch through the embedded server: a GRPO group's samples sent one request each
against the group in one batched ``/generate`` (what ``RemoteInferenceEngine.agenerate_group``
sends), side by side on one server, in alternating rounds.

    python -m benchmarks.micro.group_generate [--quick] [--model-path DIR] [--prompts 8] [--samples 8]
                                        [--tokens 5] [--prompt-len 25] [--rounds 7] [--routed-experts]

Each round sends ``--prompts`` random prompts x ``--samples`` samples of at most ``--tokens``
new tokens (temperature 1), all at once, and waits for every answer. Per way of sending:
median seconds per batch, the server's forward passes per batch (``/server_info``) and the
client's CPU seconds per batch; then the ratio per-sample / batched. The server prefills a
group's identical prompts once when they are admitted together (``servers/engine/shared_prefill.py``),
which the batched form guarantees.

With ``--routed-experts`` the server is the tiny mixture-of-experts model (unless
``--model-path``) launched with ``--enable-return-routed-experts``, and the two ways are the
batched form without and with ``return_routed_experts`` (what routing replay asks for): the
throughput change and the response bytes per generated token that carrying the experts costs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _params(tokens: int) -> dict:
    return {"max_new_tokens": tokens, "temperature": 1.0, "top_p": 1.0, "top_k": -1,
            "min_p": 0.0, "ignore_eos": False}


def bodies(prompts: list[list[int]], samples: int, tokens: int, batched: bool, tag: str,
           routed: bool = False) -> list[dict]:
    """The /generate bodies of one batch: one per sample, or one per group."""
    common = {"return_logprob": True, "logprob_start_len": -1, "stream": False}
    if routed:
        common["return_routed_experts"] = True
    if batched:
        return [{**common, "input_ids": [p] * samples, "sampling_params": _params(tokens),
                 "rid": [f"{tag}-{j}-{i}" for i in range(samples)]} for j, p in enumerate(prompts)]
    return [{**common, "input_ids": p, "sampling_params": _params(tokens), "rid": f"{tag}-{j}-{i}"}
            for j, p in enumerate(prompts) for i in range(samples)]


async def _batch(session, url: str, reqs: list[dict]) -> tuple[int, int]:
    """Send the batch; (response bytes, generated tokens) over all its answers."""
    async def one(body: dict) -> tuple[int, int]:
        async with session.post(url, json=body) as r:
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {(await r.text())[:300]}")
            raw = await r.read()
        items = json.loads(raw)
        items = items if isinstance(items, list) else [items]
        return len(raw), sum(len(it["output_ids"]) for it in items)

    sizes = await asyncio.gather(*(one(b) for b in reqs))
    return sum(s[0] for s in sizes), sum(s[1] for s in sizes)


async def _forwards(session, addr: str) -> int:
    async with session.get(f"http://{addr}/server_info") as r:
        return int((await r.json())["internal_states"][0]["forward_passes_total"])


async def measure(addr: str, a: argparse.Namespace) -> dict[str, list[tuple[float, int, float]]]:
    import aiohttp

    rng = random.Random(a.seed)
    url = f"http://{addr}/generate"
    ways = ["batched", "batched+routed"] if a.routed_experts else ["per-sample", "batched"]
    out: dict[str, list[tuple[float, int, float, float]]] = {w: [] for w in ways}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as s:
        for k in range(a.rounds + 1):  # round 0 warms both ways up
            for way in out:
                prompts = [[rng.randrange(3, 60) for _ in range(a.prompt_len)] for _ in range(a.prompts)]
                reqs = bodies(prompts, a.samples, a.tokens, way != "per-sample", f"{way}{k}",
                              routed=way == "batched+routed")
                f0, c0, t0 = await _forwards(s, addr), time.process_time(), time.perf_counter()
                nbytes, ntok = await _batch(s, url, reqs)
                dt, cpu = time.perf_counter() - t0, time.process_time() - c0
                if k:
                    out[way].append((dt, await _forwards(s, addr) - f0, cpu, nbytes / max(ntok, 1)))
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="3 rounds")
    p.add_argument("--model-path", default=None, help="HF model dir (default: build the tiny model)")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--tokens", type=int, default=5)
    p.add_argument("--prompt-len", type=int, default=25)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--routed-experts", action="store_true",
                   help="MoE server: batched without vs with return_routed_experts")
    a = p.parse_args(argv)
    if a.quick:
        a.rounds = 3
    if min(a.prompts, a.samples, a.tokens, a.prompt_len, a.rounds) < 1:
        p.error("--prompts, --samples, --tokens, --prompt-len and --rounds must be >= 1")
    import tempfile

    from benchmarks.harness.server_process import Server

    with tempfile.TemporaryDirectory(prefix="group-generate-") as tmp:
        model = a.model_path
        if model is None:
            from arealite.demo.tiny import TinyModelSpec, build_tiny_model

            model = str(build_tiny_model(tmp, TinyModelSpec(moe=a.routed_experts)))
        extra = ["--enable-return-routed-experts"] if a.routed_experts else []
        with Server(model, *extra) as srv:
            res = asyncio.run(measure(srv.addr, a))
    print(f"{a.prompts} prompts x {a.samples} samples, at most {a.tokens} new tokens, "
          f"{a.prompt_len}-token prompts, {a.rounds} rounds each")
    med = {}
    for way, rows in res.items():
        med[way] = statistics.median(r[0] for r in rows)
        print(f"{way:>10}: {med[way]:.3f} s/batch, forward passes per batch "
              f"{statistics.median(r[1] for r in rows):.0f}, client CPU "
              f"{statistics.median(r[2] for r in rows) * 1000:.1f} ms/batch, response "
              f"{statistics.median(r[3] for r in rows):.0f} bytes per generated token")
    first, second = list(med)
    print(f"ratio {first} / {second} seconds per batch: {med[first] / med[second]:.2f}x")


if __name__ == "__main__":
    main()
