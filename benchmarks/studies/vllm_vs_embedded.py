"""The main job on real vLLM against the embedded server, same model and workload, in one run.

    python -m benchmarks.studies.vllm_vs_embedded [--quick] [--steps N]

Every run is ``configs/toy_grpo.yaml`` (async GRPO, eta = 2, one server, one trainer, one torch
thread each) on the main job's SFT warm start (built as ``make run`` builds it when missing),
through the local launcher, one after the other on the same machine:

- ``embedded-broadcast``: the main job as shipped (weights over a gloo broadcast each step);
- ``embedded-disk``: the same with ``weight_update.type=disk``, vLLM's update path;
- ``vllm-disk``: ``launcher.server_backend=vllm`` (``make setup-vllm``).

Figures per run, from its ``metrics.jsonl`` over the steps after the first ``--warmup``:
seconds per step (median of ``timeperf/step``), generated tokens per second (output tokens of
the trained samples ÷ the time those steps took), the weight-update time per step, the
server's start-up time (launch to the trainer's first step, so it includes the trainer's own
start) and the final sampled reward. Prints a markdown table and the ratios vLLM / embedded;
writes ``benchmarks/results/vllm_vs_embedded/vllm_vs_embedded[_quick].json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.paths import ROOT, results_dir

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

RESULTS = results_dir("vllm_vs_embedded")
CONFIG = str(ROOT / "configs" / "toy_grpo.yaml")
RUNS = {
    "embedded-broadcast": ["launcher.server_backend=embedded", "weight_update.type=distributed"],
    "embedded-disk": ["launcher.server_backend=embedded", "weight_update.type=disk"],
    "vllm-disk": ["launcher.server_backend=vllm", "weight_update.type=disk"],
}


def run(name: str, a: argparse.Namespace, model: Path, data: Path) -> dict[str, Any]:
    from arealite.launcher.local import main as launch

    out = Path(a.fileroot) / "bench-vllm" / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    argv = [CONFIG, f"actor.path={model}", f"train_dataset.path={data / 'train.jsonl'}",
            "valid_dataset=null", "evaluator.freq_steps=null", f"cluster.fileroot={a.fileroot}",
            "experiment_name=bench-vllm", f"trial_name={name}", f"total_train_steps={a.steps}",
            "stats_logger.tensorboard=false", "launcher.startup_timeout=600", *RUNS[name]]
    print(f"== {name}: arealite train {' '.join(argv)}", flush=True)
    t0 = time.monotonic()
    with open(out / "console.log", "w") as f, contextlib.redirect_stdout(f), \
            contextlib.redirect_stderr(f):
        code = launch(argv)
    wall = time.monotonic() - t0
    if code != 0:
        tail = (out / "console.log").read_text().splitlines()[-30:]
        raise SystemExit(f"run {name} failed (exit {code}):\n" + "\n".join(tail))
    rows = [json.loads(x) for x in (out / "logs" / "metrics.jsonl").read_text().splitlines()
            if x.strip()]
    steps = [r for r in rows if r.get("step", 0) >= 1]
    timed = steps[a.warmup:]
    step_s = [r["timeperf/step"] for r in timed]
    gen_tokens = sum(r["n_seqs"] * r["gen_len/avg"] for r in timed)
    first_step_at = wall - steps[-1]["elapsed_s"] if steps else float("nan")
    res = {
        "run": name, "steps": len(steps), "wall_s": wall,
        "s_per_step": statistics.median(step_s),
        "gen_tokens_per_s": gen_tokens / sum(step_s),
        "weight_sync_s": statistics.median(r["timeperf/weight_sync"] for r in timed),
        "startup_s": first_step_at,
        "reward_first": statistics.mean(r["reward"] for r in steps[:5]),
        "reward_last": statistics.mean(r["reward"] for r in steps[-5:]),
    }
    print(f"   {name}: {res['s_per_step']:.3f} s/step, {res['gen_tokens_per_s']:.0f} generated "
          f"tokens/s, weight sync {res['weight_sync_s'] * 1e3:.0f} ms, start-up "
          f"{res['startup_s']:.0f} s", flush=True)
    return res


def table(results: list[dict[str, Any]]) -> str:
    rows = ["| run | s/step | generated tokens/s | weight sync ms | start-up s | reward first 5 "
            "-> last 5 steps |", "|---|---|---|---|---|---|"]
    rows += [f"| {r['run']} | {r['s_per_step']:.3f} | {r['gen_tokens_per_s']:.0f} | "
             f"{r['weight_sync_s'] * 1e3:.0f} | {r['startup_s']:.0f} | "
             f"{r['reward_first']:.2f} -> {r['reward_last']:.2f} |" for r in results]
    return "\n".join(rows)


def page_section() -> str | None:
    """docs/benchmarks.md's section (``benchmarks.harness.run_all``): the last results and which
    backend to pick when; None before a first run."""
    paths = [RESULTS / "vllm_vs_embedded.json", RESULTS / "vllm_vs_embedded_quick.json"]
    path = next((p for p in paths if p.is_file()), None)
    if path is None:
        return None
    r = json.loads(path.read_text())
    s = r["settings"]
    return (f"`python -m benchmarks.studies.vllm_vs_embedded --steps {s['steps']}` "
            f"(`{path.relative_to(ROOT)}`; figures over steps {s['warmup'] + 1}-{s['steps']}):\n\n"
            + table(r["runs"]) + "\n\n" + PICK)


PICK = """\
Which to pick when:

- **The embedded server** (the default) on CPU machines like these: in the table it trains at
  the same speed or faster, starts sooner (start-up: launch to the trainer's first step), and
  its broadcast update skips the disk (weight sync). Also whenever a run needs a broadcast
  update or checksum-verified updates, which arealite does only with SGLang-protocol servers.
- **vLLM** (`launcher.server_backend=vllm`) on GPUs for real models (its kernels, paged
  attention and model coverage), or to check that a result does not depend on our own server:
  same client, workflows and invariants, per-token versions reported by vLLM itself. Updates go
  through the disk; the model needs untied embeddings (and on CPU a head_dim vLLM's CPU
  attention serves).
- **Real SGLang** (`launcher.server_backend=sglang`) on GPUs when a run needs the broadcast
  update (`weight_update.type=distributed`), which arealite does not send to vLLM yet."""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="20 steps")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=3, help="first steps left out of the figures")
    p.add_argument("--fileroot", default=str(ROOT / "outputs"))
    a = p.parse_args(argv)
    if a.quick:
        a.steps = 20
    from arealite.backends.vllm.server_command import vllm_python

    if vllm_python(dict(os.environ)) == sys.executable:
        print("vllm_vs_embedded: no .venv-vllm (run make setup-vllm): not run", flush=True)
        return 0
    from benchmarks.harness.warm_start import ensure_model

    model, data = ensure_model(Path(a.fileroot))
    results = [run(name, a, model, data) for name in RUNS]
    by = {r["run"]: r for r in results}
    print("\n" + table(results))
    v = by["vllm-disk"]
    for ref in ("embedded-broadcast", "embedded-disk"):
        e = by[ref]
        # figure lines for benchmarks.harness.run_all (no target: a comparison, not a goal)
        print(f"vllm-disk / {ref} seconds per step: {v['s_per_step'] / e['s_per_step']:.2f}x "
              "(target: none; informative)")
        print(f"vllm-disk / {ref} generated tokens/s: "
              f"{v['gen_tokens_per_s'] / e['gen_tokens_per_s']:.2f}x (target: none; informative)")
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"vllm_vs_embedded{'_quick' if a.quick else ''}.json"
    path.write_text(json.dumps({"settings": vars(a), "runs": results}, indent=2))
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
