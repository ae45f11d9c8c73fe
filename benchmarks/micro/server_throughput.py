"""Throughput of the embedded server vs transformers ``generate``, same model and same tokens.

    python -m benchmarks.micro.server_throughput [--quick] [--model-path DIR] [--n 64]

Workload: N concurrent requests with random prompts and long-tailed ``max_new_tokens``
(``ignore_eos``, so every method produces exactly the same number of tokens). Compared side by
side in one run, each with one torch compute thread:
  1. the embedded server (continuous batching), all N requests sent at once over HTTP;
  2. transformers ``generate``, one request at a time;
  3. transformers ``generate`` on one static left-padded batch of all N requests (runs to the
     longest request; only each request's own tokens count).
Prints tokens/s for each and the ratios server/one-at-a-time and server/static-batch.

    python -m benchmarks.micro.server_throughput --mixed-constrained [--quick] [--rounds PAIRS]

Structured outputs in a batch: the same N requests in paired rounds on one server, all
unconstrained and with every other request constrained by a regex (``[a-z ]{8192}``: a grammar
mask every step, and it never ends a row early), each round one batched ``/generate`` call (all
requests enter the engine together, so both kinds of round run the same batches), the pairs in
ABBA order. Two figures side by
side, for the requests that are unconstrained in both: their throughput (their tokens / the
longest of their server-side latencies), mixed / all-unconstrained, as the median of the pairs' ratios;
and their tokens per server CPU second, mixed / all-unconstrained (median of pairs): the
grammar work's cost without the time the server waits for a core on a shared machine. Both
targets >= 0.95; the run is kept in ``benchmarks/results/server_throughput/``.

The real-model job's own requests instead of random ones (docs/real_model.md): ``--rows`` its
held-out or train JSONL, rendered as the job's workflow renders them
(``workflows.prompting.encode_prompt``), each prompt ``--group`` times (its GRPO group), every
request ``--max-new-tokens`` long:

    python -m benchmarks.micro.server_throughput --model-path outputs/assets/smollm2 \
        --rows outputs/assets/rg/<hash>/train.jsonl --group 8 --n 64 --max-new-tokens 24
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness.server_process import Server

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def workload(n: int, vocab: int, seed: int, max_len: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    reqs = []
    for _ in range(n):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(8, 32))]
        # Long tail: most requests short, a few long (Pareto), as in RL rollouts.
        new = int(min(max_len, 8 + 10 * rng.paretovariate(1.2)))
        reqs.append((prompt, new))
    return reqs


def job_workload(rows_path: str, model_path: str, n: int, group: int,
                 new: int) -> list[tuple[list[int], int]]:
    """``n`` requests of the job: ``n // group`` rows' prompts, each ``group`` times."""
    import json

    from transformers import AutoTokenizer

    from workflows.prompting import encode_prompt

    tok = AutoTokenizer.from_pretrained(model_path)
    lines = [ln for ln in open(rows_path).read().splitlines() if ln.strip()][: max(1, n // group)]
    return [(encode_prompt(tok, json.loads(ln))[0], new) for ln in lines for _ in range(group)]


def _sample_kwargs(new: int, pad_id: int) -> dict:
    # Same sampling as the server: temperature 1, no top-k/top-p; exact length (ignore_eos).
    return dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new,
                min_new_tokens=new, pad_token_id=pad_id)


def bench_one_at_a_time(model, reqs, pad_id: int) -> tuple[float, int]:
    import torch

    t0 = time.perf_counter()
    tokens = 0
    with torch.inference_mode():
        for prompt, new in reqs:
            out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt),
                                 dtype=torch.long), **_sample_kwargs(new, pad_id))
            tokens += out.shape[1] - len(prompt)
    return time.perf_counter() - t0, tokens


def bench_static_batch(model, reqs, pad_id: int) -> tuple[float, int]:
    import torch

    longest = max(len(p) for p, _ in reqs)
    ids = torch.full((len(reqs), longest), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, _) in enumerate(reqs):  # left padding
        ids[i, longest - len(p):] = torch.tensor(p)
        mask[i, longest - len(p):] = 1
    t0 = time.perf_counter()
    with torch.inference_mode():
        model.generate(ids, attention_mask=mask, **_sample_kwargs(max(m for _, m in reqs), pad_id))
    # The batch runs until the longest request is done; each request only wanted its own tokens.
    return time.perf_counter() - t0, sum(m for _, m in reqs)


# Never complete within a request: a token holds at most a few dozen letters, so the grammar
# cannot end (and end its row early) before max_new_tokens; both rounds produce the same tokens.
MIX_REGEX = "[a-z ]{8192}"


async def _mixed_round(addr: str, reqs, constrain_odd: bool) -> tuple[int, float, int]:
    """(tokens, seconds) of the even requests, with the odd ones constrained or not, and the
    tokens of all requests (the same in both kinds of round: the grammar never ends a row).

    All requests go in one batched ``/generate`` call, so they enter the engine together and
    every round runs the same batches (one prefill of all, then decode steps whose batch
    shrinks as requests reach their lengths) whatever the load does to separate requests'
    arrival. The seconds are the even requests' longest ``e2e_latency`` (the server's own
    clock, from the call's arrival: grammar set-up included)."""
    import aiohttp

    sps = []
    for i, (_, m) in enumerate(reqs):
        sp = {"max_new_tokens": m, "temperature": 1.0, "ignore_eos": True}
        if constrain_odd and i % 2:
            sp["regex"] = MIX_REGEX
        sps.append(sp)
    body = {"input_ids": [p for p, _ in reqs], "sampling_params": sps}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as s:
        async with s.post(f"http://{addr}/generate", json=body) as r:
            outs = [o["meta_info"] for o in await r.json()]
    even = outs[0::2]
    return (sum(o["completion_tokens"] for o in even), max(o["e2e_latency"] for o in even),
            sum(o["completion_tokens"] for o in outs))


def pair_summary(ratios: list[float]) -> dict[str, float]:
    """Median and quartiles of per-pair ratios (the spread says how much the load moved)."""
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return {"median": statistics.median(ratios), "q1": q[0], "q3": q[2],
            "min": min(ratios), "max": max(ratios)}


PLAIN, MIXED = "all unconstrained", "mixed"


def mixed_constrained(model_path: str, vocab: int, args) -> dict:
    """Paired rounds in ABBA order (plain-mixed, mixed-plain, ...) so that a drift in the
    machine's load hits both kinds alike; two figures side by side: the unconstrained
    requests' wall-clock throughput (median of the pairs' ratios) and their tokens per server
    CPU second (the same tokens in both rounds, so the pair's CPU ratio is the grammar work's
    cost, free of the time the server waits for a core on a shared machine)."""
    reqs = workload(args.n, vocab, args.seed, args.max_new_tokens)
    load_start = os.getloadavg()[0]
    print(f"model={model_path} requests={len(reqs)} (every other one constrained in the mixed "
          f"batch by {MIX_REGEX!r}) new_tokens total={sum(m for _, m in reqs)} pairs={args.rounds} "
          f"(ABBA) cores={os.cpu_count()} load average at start={load_start:.2f}",
          flush=True)
    import psutil

    rounds: list[dict] = []
    with Server(model_path) as server:
        proc = psutil.Process(server.proc.pid)

        def cpu_seconds() -> float:
            t = proc.cpu_times()
            return t.user + t.system

        for mixed in (True, False):  # warm-up, discarded: grammar compiled, buffers grown
            asyncio.run(_mixed_round(server.addr, reqs, mixed))
        for k in range(args.rounds):
            for mixed in ((False, True) if k % 2 == 0 else (True, False)):
                c0 = cpu_seconds()
                toks, secs, total = asyncio.run(_mixed_round(server.addr, reqs, mixed))
                r = {"pair": k, "kind": MIXED if mixed else PLAIN, "tokens": toks,
                     "seconds": secs, "all_tokens": total, "cpu": cpu_seconds() - c0}
                rounds.append(r)
                print(f"pair {k}: {r['kind']:18s} unconstrained requests {toks / secs:9.1f} "
                      f"tokens/s, server CPU {r['cpu']:6.2f} s, all tokens {total}", flush=True)
    load_end = os.getloadavg()[0]
    by = {(r["pair"], r["kind"]): r for r in rounds}
    pairs = [(by[k, PLAIN], by[k, MIXED]) for k in range(args.rounds)]
    wall = [(m["tokens"] / m["seconds"]) / (a["tokens"] / a["seconds"]) for a, m in pairs]
    cpu = [(m["tokens"] / m["cpu"]) / (a["tokens"] / a["cpu"]) for a, m in pairs]
    same = all(a["all_tokens"] == m["all_tokens"] for a, m in pairs)
    ws, cs = pair_summary(wall), pair_summary(cpu)
    for name in (PLAIN, MIXED):
        vals = [r["tokens"] / r["seconds"] for r in rounds if r["kind"] == name]
        print(f"{name:18s} median {statistics.median(vals):9.1f} tokens/s (unconstrained requests)")
    print(f"same tokens in both kinds of round: {same}; load average at end={load_end:.2f} on "
          f"{os.cpu_count()} cores (a loaded machine swings the wall clock)")
    headlines = [
        f"paired wall ratios mixed / all-unconstrained: {' '.join(f'{r:.3f}' for r in wall)}",
        f"paired CPU ratios  mixed / all-unconstrained: {' '.join(f'{r:.3f}' for r in cpu)}",
        f"unconstrained throughput mixed / all-unconstrained by wall clock (median of "
        f"{len(wall)} pairs, quartiles {ws['q1']:.3f}-{ws['q3']:.3f}): {ws['median']:.3f} "
        "(target >= 0.95)",
        f"unconstrained tokens per server CPU second mixed / all-unconstrained (median of "
        f"{len(cpu)} pairs, quartiles {cs['q1']:.3f}-{cs['q3']:.3f}): {cs['median']:.3f} "
        "(target >= 0.95)"]
    print("\n".join(headlines))
    return {"model": model_path, "vocab": vocab, "regex": MIX_REGEX, "requests": len(reqs),
            "max_new_tokens": args.max_new_tokens, "pairs": args.rounds, "order": "ABBA",
            "cores": os.cpu_count(), "load_average_start_end": [load_start, load_end],
            "same_tokens": same, "wall_ratio": ws, "cpu_ratio": cs, "wall_ratios": wall,
            "cpu_ratios": cpu, "headlines": headlines, "rounds": rounds}


def write_result(run: dict, path: str | None, model_path: str | None, kind: str = "mixed_constrained") -> Path:
    """Keep a run in ``benchmarks/results/server_throughput/{kind}_{model}.json`` (one file per
    kind and model: the tiny one or the ``--model-path`` folder's name)."""
    from benchmarks.harness.paths import results_dir
    from benchmarks.harness.report import machine_info

    tag = model_tag(model_path)
    out = Path(path) if path else results_dir("server_throughput") / f"{kind}_{tag}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    run = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "command": "python -m benchmarks.micro.server_throughput " + " ".join(sys.argv[1:]),
           "machine": machine_info(), **run}
    out.write_text(json.dumps(run, indent=1))
    print(f"results: {out}")
    return out


def model_tag(model_path: str | None) -> str:
    return "tiny" if model_path is None else Path(model_path).name


def _kept_entry(title: str, what: str, r: dict, notes: list[str], about: str) -> dict:
    """A kept run (its ``headlines`` carry the targets) as a row group of docs/benchmarks.md,
    named ``TITLE (WHAT, ran DATE)``."""
    from benchmarks.harness.report import parse_figures

    return {"name": f"{title} ({what}, ran {r['date'][:10]})", "command": r["command"], "status": f"ran {r['date']}",
            "seconds": None, "notes": notes, "about": about,
            "figures": [f.as_dict() for f in parse_figures("server_throughput", "\n".join(r["headlines"]))]}


def _load(r: dict) -> str:
    return "-".join(f"{x:.1f}" for x in r["load_average_start_end"])


def page_entry(r: dict) -> dict:
    """A kept mixed-constrained run as a row group of docs/benchmarks.md (benchmarks.harness
    .run_all adds one per ``mixed_constrained_*.json``)."""
    model = (f"the tiny test model (vocabulary {r['vocab']})" if r["model_tag"] == "tiny" else
             f"the `--model-path` model `{r['model_tag']}` (vocabulary {r['vocab']}; SmolLM2-135M-"
             "Instruct is `arealite.demo.smollm2.import_smollm2(DIR)`)")
    return _kept_entry(
        "server_throughput, mixed constrained", f"{r['model_tag']}, {r['pairs']} pairs", r, r["headlines"],
        f"Unconstrained requests' throughput with every other request of the batch "
        f"regex-constrained, against the same requests all unconstrained "
        f"({r['requests']} requests, up to {r['max_new_tokens']} new tokens, pairs in "
        f"ABBA order), on {model}; load average {_load(r)} on {r['cores']} cores during "
        f"the run. All rounds in `benchmarks/results/server_throughput/`.")


def rows_entry(r: dict) -> dict:
    """A kept ``--rows`` run (the job's own requests) as a row group of docs/benchmarks.md
    (benchmarks.harness.run_all adds one per ``rows_*.json``)."""
    return _kept_entry(
        "server_throughput on the job's requests", f"{r['model_tag']}, {r['requests']} requests", r, r["lines"],
        f"The real-model job's prompts ({r['rows']}, each {r['group']} times as a GRPO "
        f"group, {r['max_new_tokens']} new tokens each) on `{r['model_tag']}`, best of "
        f"{r['rounds']} rounds per method, one torch thread each; load average {_load(r)} on "
        f"{r['cores']} cores during the run (docs/real_model.md).")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-path", default=None, help="HF model dir (default: build the tiny model)")
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=400)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=3, help="rounds (with --mixed-constrained: pairs)")
    p.add_argument("--quick", action="store_true", help="32 requests, shorter tail, two rounds")
    p.add_argument("--mixed-constrained", action="store_true",
                   help="unconstrained throughput with and without regex-constrained neighbours")
    p.add_argument("--out", default=None, help="with --mixed-constrained: results file (default: "
                   "benchmarks/results/server_throughput/mixed_constrained_<model>.json)")
    p.add_argument("--rows", default=None, help="the job's rows (JSONL): its prompts, not random ones")
    p.add_argument("--group", type=int, default=8, help="with --rows: requests per prompt")
    args = p.parse_args(argv)
    if args.quick:
        args.n, args.max_new_tokens, args.rounds = 32, 128, 2

    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model_path = args.model_path
    if model_path is None:
        from arealite.demo.tiny import build_tiny_model

        model_path = str(build_tiny_model(tempfile.mkdtemp(prefix="bench_tiny_")))
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    vocab = model.config.vocab_size
    if args.mixed_constrained:
        run = {"model_tag": model_tag(args.model_path), **mixed_constrained(model_path, vocab, args)}
        write_result(run, args.out, args.model_path)
        return
    pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    if args.rows:
        reqs = job_workload(args.rows, model_path, args.n, args.group, args.max_new_tokens)
    else:
        reqs = workload(args.n, vocab, args.seed, args.max_new_tokens)
    lens = sorted(m for _, m in reqs)
    print(f"model={model_path} requests={len(reqs)} new_tokens total={sum(lens)} "
          f"median={lens[len(lens) // 2]} max={lens[-1]} threads=1", flush=True)

    # Rounds alternate the three methods so that load from other processes on a shared machine
    # hits all of them alike; each method reports its best round.
    names = ("server (continuous batching)", "HF generate, one at a time",
             "HF generate, static padded batch")
    best: dict[str, tuple[float, int]] = {}
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    load_start = os.getloadavg()[0]
    with Server(model_path) as server:
        for rnd in range(args.rounds):
            runs = (server.run(reqs), bench_one_at_a_time(model, reqs, pad_id),
                    bench_static_batch(model, reqs, pad_id))
            for name, (secs, toks) in zip(names, runs):
                if name not in best or secs < best[name][0]:
                    best[name] = (secs, toks)
                say(f"round {rnd}: {name:34s} {toks / secs:9.1f} tokens/s")
    tps = {}
    for name, (secs, toks) in best.items():
        tps[name] = toks / secs
        say(f"{name:36s} {toks:6d} tokens {secs:8.2f} s {tps[name]:9.1f} tokens/s")
    srv = tps["server (continuous batching)"]
    headlines = [f"ratio server / one-at-a-time : {srv / tps['HF generate, one at a time']:.2f}x (target >= 5x)",
                 f"ratio server / static batch  : {srv / tps['HF generate, static padded batch']:.2f}x (target >= 1.5x)"]
    for line in headlines:
        say(line)
    if args.rows:  # the job's own requests: kept for docs/benchmarks.md (random ones are `make bench`'s)
        write_result({"model_tag": model_tag(args.model_path), "rows": args.rows, "group": args.group,
                      "requests": len(reqs), "max_new_tokens": args.max_new_tokens, "rounds": args.rounds,
                      "cores": os.cpu_count(), "load_average_start_end": [load_start, os.getloadavg()[0]],
                      "tokens_per_s": tps, "lines": lines, "headlines": headlines},
                     None, args.model_path, kind="rows")


if __name__ == "__main__":
    main()
