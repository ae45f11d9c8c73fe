"""The main job disaggregated (async, gloo broadcast: the default), co-located
(``launcher.colocate=true``: sync, shared-memory pushes, servers released while the trainer
trains) and co-located with the servers stopped and started again around every train phase
(``launcher.colocate_servers=recreate``), one after the other on the same SFT warm start, steps
and evaluations. Prints, per mode: wall seconds, seconds per step, held-out accuracy at the
start, middle and end, the mean training reward of the first and last thirds, the largest
behaviour-vs-trainer logprob gap and, co-located, the mean time of each phase switch.

    python -m benchmarks.studies.colocated_job [--quick] [--steps N] [--modes a,b,...]

The assets (tiny model, toy task, SFT warm start) are reused from ``outputs/assets`` when
``make run`` built them, else built in a temporary folder first.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODES = {"disaggregated": [], "colocated": ["launcher.colocate=true"],
         "recreated": ["launcher.colocate=true", "launcher.colocate_servers=recreate"]}


def run(fileroot: Path, trial: str, steps: int, extra: list[str]) -> tuple[float, list[dict]]:
    cmd = [sys.executable, "-m", "arealite.cli.main", "main-job", f"cluster.fileroot={fileroot}",
           f"total_train_steps={steps}", f"evaluator.freq_steps={steps // 2}",
           f"trial_name={trial}", *extra]
    t0 = time.monotonic()
    with open(fileroot / f"{trial}.log", "w") as log:
        code = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                              timeout=3600).returncode
    secs = time.monotonic() - t0
    if code != 0:
        raise SystemExit(f"{trial} failed (exit {code}); log: {fileroot / f'{trial}.log'}")
    path = fileroot / "toy-grpo" / trial / "logs" / "metrics.jsonl"
    return secs, [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="30 steps instead of 90")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--modes", default=",".join(MODES), help=f"some of {','.join(MODES)}")
    a = ap.parse_args()
    steps = a.steps or (30 if a.quick else 90)
    modes = a.modes.split(",")
    if not set(modes) <= set(MODES):
        raise SystemExit(f"--modes: unknown {sorted(set(modes) - set(MODES))}")
    with tempfile.TemporaryDirectory() as d:
        fileroot = Path(d)
        built = ROOT / "outputs" / "assets"
        if (built / "sft_model" / "config.json").is_file():
            (fileroot / "assets").symlink_to(built)
        res = {m: run(fileroot, m, steps, MODES[m]) for m in modes}
    print(f"main job, {steps} steps, disaggregated (async, eta from configs/toy_grpo.yaml) vs "
          "co-located (sync, launcher.colocate=true; recreated: colocate_servers=recreate), "
          "same SFT warm start")
    print(f"{'mode':>14} {'wall s':>7} {'s/step':>7} {'acc start':>10} {'acc mid':>8} "
          f"{'acc end':>8} {'reward 1st/3':>13} {'reward 3rd/3':>13} {'max |dlogp|':>12}")
    for mode, (secs, rows) in res.items():
        st = [r for r in rows if r["step"] >= 1]
        acc = [r["eval/score"] for r in rows if "eval/score" in r]
        third = max(1, len(st) // 3)
        early = statistics.mean(r["reward"] for r in st[:third])
        late = statistics.mean(r["reward"] for r in st[-third:])
        per_step = statistics.mean(r["timeperf/step"] for r in st)
        # logged on the steps whose tokens came from the weights being trained (all of them,
        # synchronously; async, those with no stale token)
        gap = max((r["logprob_agreement/max_abs_diff"] for r in st
                   if "logprob_agreement/max_abs_diff" in r), default=float("nan"))
        print(f"{mode:>14} {secs:>7.0f} {per_step:>7.2f} {acc[0]:>10.3f} "
              f"{acc[len(acc) // 2]:>8.3f} {acc[-1]:>8.3f} {early:>13.3f} {late:>13.3f} "
              f"{gap:>12.1e}")
    for mode in [m for m in res if m != "disaggregated"]:
        st = [r for r in res[mode][1] if r["step"] >= 1]
        names = [k.removeprefix("colocate/").removesuffix("_seconds") for k in st[0]
                 if k.startswith("colocate/") and k.endswith("_seconds")]
        print(f"{mode} phase switches, mean per step: " + ", ".join(
            f"{n} {statistics.mean(r[f'colocate/{n}_seconds'] for r in st) * 1e3:.1f} ms"
            for n in names))


if __name__ == "__main__":
    main()
