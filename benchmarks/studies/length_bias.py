"""Length bias of asynchronous training: does the trainer see the lengths the policy generates?

Short runs of the main job (``configs/toy_grpo.yaml`` on the main job's assets: SFT model and
toy arithmetic) and of the long-tail workload (the same with ``tail_fraction`` of the samples
decoding ``tail_tokens`` past EOS: ``benchmarks/studies/longtail_workflow.py``) at eta = 1, 2
and 4, one after the other. From each run's metrics (``observe/length_bias.py``): the run's
trained / generated mean-length ratio (``length_bias/run_mean_ratio`` at the last step: every
trajectory that finished generating, stale drops and turned-down groups included, against
every trained one), the mean of the per-step ratios (mean and p90) and KS distances, and the
share of generated tokens never trained (``rollout/untrained_token_share``).

    python -m benchmarks.studies.length_bias                 # 30 steps a run, both workloads
    python -m benchmarks.studies.length_bias --quick         # 10 steps, main job only

Results: ``benchmarks/results/length_bias/length_bias[_quick].json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.grpo_runs import launcher_cmd, log_tail, metrics
from benchmarks.harness.paths import ROOT, results_dir

WORKFLOW = "benchmarks.studies.longtail_workflow:LongTailRLVRWorkflow"
BAND = (0.97, 1.03)  # the issue's target for the run's trained / generated mean-length ratio


def workload_overrides(workload: str, a: argparse.Namespace) -> list[str]:
    if workload == "main":
        return []
    return [f"workflow.path={WORKFLOW}", f"workflow.kwargs.tail_fraction={a.tail_fraction}",
            f"workflow.kwargs.tail_max_new_tokens={a.tail_tokens}"]


def run(workload: str, eta: int, a: argparse.Namespace, assets: Path, root: Path) -> dict[str, Any]:
    import subprocess

    trial = f"{workload}-eta{eta}"
    over = [f"actor.path={assets / 'sft_model'}",
            f"train_dataset.path={assets / 'toy_math' / 'train.jsonl'}", "valid_dataset=null",
            "evaluator.freq_steps=null", f"total_train_steps={a.steps}",
            f"rollout.max_head_offpolicyness={eta}", "stats_logger.tensorboard=false",
            *workload_overrides(workload, a)]
    shutil.rmtree(root / "toy-grpo" / trial, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    log = root / f"{trial}.log"
    t0, load = time.monotonic(), os.getloadavg()[0]
    with open(log, "w") as f:
        code = subprocess.call(launcher_cmd("configs/toy_grpo.yaml", root, trial, over), stdout=f,
                               stderr=subprocess.STDOUT, cwd=ROOT)
    rows = [r for r in metrics(root, trial) if r.get("step", 0) >= 1]
    out: dict[str, Any] = {"workload": workload, "eta": eta, "exit": code, "steps": len(rows),
                           "wall_s": round(time.monotonic() - t0, 1), "load_avg": round(load, 1)}
    if code != 0 or not rows:
        out["log"] = log_tail(str(log), 30)
        return out

    def mean(key: str) -> float | None:
        vals = [r[key] for r in rows if key in r]
        return sum(vals) / len(vals) if vals else None

    last = rows[-1]
    out.update(run_mean_ratio=last.get("length_bias/run_mean_ratio"),
               step_mean_ratio=mean("length_bias/mean_ratio"),
               step_p90_ratio=mean("length_bias/p90_ratio"), step_ks=mean("length_bias/ks"),
               reward_diff=mean("length_bias/reward_diff"),
               untrained_token_share=last.get("rollout/untrained_token_share", 0.0),
               stale=last.get("rollout/stale", 0.0), redrawn=last.get("rollout/redrawn", 0.0),
               gen_mean_len=mean("length_bias/gen_mean_len"))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="10 steps a run, the main job only")
    p.add_argument("--steps", type=int, default=None, help="steps a run (default 30; quick 10)")
    p.add_argument("--etas", default="1,2,4")
    p.add_argument("--workloads", default=None, help="main,longtail (quick: main)")
    p.add_argument("--tail-fraction", type=float, default=0.1)
    p.add_argument("--tail-tokens", type=int, default=128)
    p.add_argument("--assets", default=str(ROOT / "outputs" / "assets"),
                   help="the main job's assets (built by `arealite main-job` when missing)")
    p.add_argument("--root", default=None, help="work folder (default: a new temporary one)")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    a.steps = a.steps or (10 if a.quick else 30)
    workloads = (a.workloads or ("main" if a.quick else "main,longtail")).split(",")
    assets = Path(a.assets)
    if not (assets / "sft_model" / "config.json").is_file():
        from arealite.demo.main_job import build_assets, ensure_sft_model

        build_assets(assets)
        if ensure_sft_model(assets, assets.parent) != 0:
            print("the main job's SFT warm start failed", file=sys.stderr)
            return 1
    root = Path(a.root) if a.root else Path(tempfile.mkdtemp(prefix="length_bias_"))
    results = []
    for workload in workloads:
        for eta in [int(x) for x in a.etas.split(",")]:
            r = run(workload, eta, a, assets, root)
            results.append(r)
            if r["exit"] != 0:
                print(f"{workload} eta={eta}: exit {r['exit']}\n{r.get('log', '')}", flush=True)
                continue
            print(f"{workload} eta={eta} ({r['steps']} steps, load {r['load_avg']}): per step mean "
                  f"ratio {r['step_mean_ratio']:.3f}, p90 ratio {r['step_p90_ratio']:.3f}, KS "
                  f"{r['step_ks']:.3f}, reward diff {r['reward_diff']:+.3f}; stale {r['stale']:.0f}, "
                  f"untrained token share {r['untrained_token_share']:.3f}", flush=True)
            print(f"trained/generated mean length, {workload} eta={eta}: {r['run_mean_ratio']:.3f} "
                  f"(target >= {BAND[0]}, <= {BAND[1]})", flush=True)
    out = Path(a.json) if a.json else results_dir("length_bias") / (
        "length_bias_quick.json" if a.quick else "length_bias.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"steps": a.steps, "runs": results}, indent=1))
    ok = all(r["exit"] == 0 and BAND[0] <= (r.get("run_mean_ratio") or 0) <= BAND[1]
             for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
