"""GRPO runs on the long-tailed toy workload through the local launcher, each with its own
``trial_name``: the runs ``benchmarks/studies/async_vs_sync.py`` compares, which
``benchmarks/studies/staleness_ablation.py`` repeats over seeds. The workload is the toy arithmetic
task where a fraction of the samples decode far past EOS (``benchmarks.studies.longtail_workflow``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.paths import ROOT
from benchmarks.harness.run_probes import CoreMeter

CONFIG = str(ROOT / "configs" / "toy_grpo.yaml")
WORKFLOW = "benchmarks.studies.longtail_workflow:LongTailRLVRWorkflow"
# name -> (async_training, eta, decoupled loss)
RUNS: dict[str, tuple[bool, int, bool]] = {
    "sync": (False, 0, True),
    "async-eta1": (True, 1, True),
    "async-eta2": (True, 2, True),
    "async-eta4": (True, 4, True),
    "async-eta4-naive": (True, 4, False),
}


def run_overrides(name: str, a: argparse.Namespace, model: Path, data: Path, experiment: str) -> list[str]:
    async_training, eta, decoupled = RUNS[name]
    return [
        f"actor.path={model}", f"train_dataset.path={data / 'train.jsonl'}",
        f"valid_dataset.path={data / 'valid.jsonl'}", f"cluster.fileroot={a.fileroot}",
        f"experiment_name={experiment}", f"trial_name={name}", f"total_train_steps={a.steps}",
        f"async_training={str(async_training).lower()}", f"rollout.max_head_offpolicyness={eta}",
        f"actor.use_decoupled_loss={str(decoupled).lower()}",
        f"actor.recompute_logprob={str(decoupled).lower()}",
        # Two batches of episodes in flight at most (the main job's setting): the embedded CPU
        # server's tokens/s peaks near 128-256 concurrent requests and halves by 512. The gate
        # still lets finished trajectories run eta batches ahead.
        f"rollout.max_concurrent_rollouts={2 * a.batch_size}",
        f"train_dataset.batch_size={a.batch_size}", f"rollout.consumer_batch_size={a.batch_size}",
        f"actor.max_tokens_per_mb={a.max_tokens_per_mb}",
        f"workflow.path={WORKFLOW}", f"workflow.kwargs.tail_fraction={a.tail_fraction}",
        f"workflow.kwargs.tail_max_new_tokens={a.tail_tokens}",
        # One held-out evaluation before and one after: an evaluation inside the timed loop
        # would let async runs generate while the trainer evaluates.
        "evaluator.freq_steps=null", f"evaluator.max_prompts={a.eval_prompts or 'null'}",
        "stats_logger.tensorboard=false", "stats_logger.print_every=10",
    ]


def launch_run(name: str, a: argparse.Namespace, model: Path, data: Path, experiment: str,
               trial: str | None = None, extra: tuple[str, ...] = ()) -> tuple[Path, dict[str, Any]]:
    """One run (``RUNS[name]``, as ``trial``, with ``extra`` overrides last) through the local
    launcher; returns its metrics.jsonl and what the machine did: the 1-minute load average when
    it started (other work skews every figure) and the cores its processes used."""
    from arealite.launcher.local import main as launch

    trial = trial or name
    out = Path(a.fileroot) / experiment / trial
    shutil.rmtree(out, ignore_errors=True)  # metrics.jsonl is appended to: start clean
    out.mkdir(parents=True)
    argv = [CONFIG, *run_overrides(name, a, model, data, experiment), f"trial_name={trial}", *extra]
    console = out / "console.log"
    t0, load = time.monotonic(), os.getloadavg()[0]
    print(f"== {trial} (load average {load:.1f}): arealite train {' '.join(argv)}", flush=True)
    cores = CoreMeter(out / "logs" / "metrics.jsonl", a.steps)
    try:
        if a.verbose:
            code = launch(argv)
        else:
            with open(console, "w") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
                code = launch(argv)
    finally:
        used = cores.close()
    if code != 0:
        tail = console.read_text().splitlines()[-30:] if console.exists() else []
        raise SystemExit(f"run {trial} failed (exit {code}); last lines of {console}:\n" + "\n".join(tail))
    print(f"   done in {time.monotonic() - t0:.0f}s (logs: {out / 'logs'}); cores used: "
          + ", ".join(f"{k} {v:.2f}" for k, v in sorted(used.items())), flush=True)
    return out / "logs" / "metrics.jsonl", {"load_1m": load, "cores": used}

