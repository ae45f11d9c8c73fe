"""Chaos on a real short run: kill things mid-run and count what it cost.

The toy GRPO job on the tiny model (4 prompts x 2 samples a step, 2 embedded servers,
recovery checkpoints every 2 steps) under the local launcher, once undisturbed and once per
scenario:

- ``server-mid-generation``: SIGKILL one server while episodes are generating;
- ``server-mid-update``: SIGKILL one server while a weight update is in flight (its
  ``/server_info`` says paused);
- ``trainer``: SIGKILL the trainer process; the launcher restarts it from its newest recovery
  checkpoint (``recover.mode=auto``);
- ``launcher-sigterm``: SIGTERM the top-level launcher, then launch again with
  ``recover.mode=auto``.

For each it prints: steps completed (of the target), prompts lost (steps that trained less than
a full batch, plus prompts given up on: ``rollout/dropped``), failed / re-drawn / stale
episodes, seconds from the fault to the next completed step (or to the launcher's exit), whether
every step trained the same prompts as the undisturbed run (sync runs; async runs train in
completion order, so only the multiset over the run is compared), the final weight version
against the undisturbed run's, and processes of the run left behind (must be 0).

    python -m benchmarks.studies.chaos            # all scenarios, async (eta = 1) and sync
    python -m benchmarks.studies.chaos --quick    # the suite's variant: fewer steps, async only
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

from benchmarks.harness.grpo_runs import (
    catch_paused_server,
    descendants,
    is_server,
    is_trainer_worker,
    last_step,
    launcher_cmd,
    log_tail,
    metrics,
    run_dir,
    signal_group,
    small_run,
    wait_exit,
    wait_until,
)

SCENARIOS = ("server-mid-generation", "server-mid-update", "trainer", "launcher-sigterm")
FAULT_AFTER = 3  # the fault comes once this step is logged


def sample_ids(fileroot: Path, trial: str) -> dict[int, list[int]]:
    from arealite.observe.sample_log import read_sample_ids

    return read_sample_ids(run_dir(fileroot, trial) / "logs" / "sample_ids.jsonl")


def left_behind(marker: str) -> list[str]:
    """Live processes whose command line names this run's folder."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if marker in cmd and p.pid != os.getpid():
            out.append(f"{p.pid}: {cmd[:120]}")
    return out


def start(config: str, fileroot: Path, trial: str, over: list[str]):
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    proc = subprocess.Popen(launcher_cmd(config, fileroot, trial, over), stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    return proc, log.name


def fault(scenario: str, proc, log: str, fileroot: Path, trial: str) -> float:
    """Inject the fault; returns the monotonic time it happened."""
    wait_until(lambda: last_step(fileroot, trial) >= FAULT_AFTER, proc, log, 300,
               f"step {FAULT_AFTER}", poll=0.02)
    if scenario == "server-mid-generation":
        victim = descendants(proc.pid, is_server)[-1]
    elif scenario == "server-mid-update":
        victim = catch_paused_server(proc, 120, http_timeout=2.0)
        if victim is None:
            raise RuntimeError(f"never caught a server inside a weight update:\n{log_tail(log, 40)}")
    elif scenario == "trainer":
        victim = descendants(proc.pid, is_trainer_worker)[0]
    else:
        t = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        return t
    t = time.monotonic()
    signal_group(victim.pid, signal.SIGKILL)
    return t


def run_one(scenario: str | None, config: str, root: Path, base_over: list[str],
            steps: int) -> dict[str, Any]:
    trial = scenario or "undisturbed"
    fileroot = root / trial
    t0 = time.monotonic()
    proc, log = start(config, fileroot, trial, base_over)
    res: dict[str, Any] = {"scenario": trial}
    try:
        if scenario is not None:
            t_fault = fault(scenario, proc, log, fileroot, trial)
            step_at_fault = last_step(fileroot, trial)
            if scenario == "launcher-sigterm":
                code = wait_exit(proc, log, 120)
                res["seconds_to_recover"] = round(time.monotonic() - t_fault, 2)
                res["launcher_exit"] = code
                res["left_after_sigterm"] = len(left_behind(str(fileroot)))
                proc, log = start(config, fileroot, trial, [*base_over, "recover.mode=auto"])
            else:
                wait_until(lambda: last_step(fileroot, trial) > step_at_fault, proc, log, 300,
                           "a step after the fault", poll=0.02)
                res["seconds_to_recover"] = round(time.monotonic() - t_fault, 2)
        code = wait_exit(proc, log, 600)
        res["exit"] = code
        if code != 0:
            res["log"] = log_tail(log, 30)
    finally:
        signal_group(proc.pid, signal.SIGKILL) if proc.poll() is None else None
    res["wall_s"] = round(time.monotonic() - t0, 1)
    time.sleep(1.0)  # children the launcher killed need a moment to be reaped
    res["left_behind"] = left_behind(str(fileroot))
    rows = [r for r in metrics(fileroot, trial) if r["step"] >= 1]
    ids = sample_ids(fileroot, trial)
    res["steps"] = len({r["step"] for r in rows})
    res["short_steps"] = sum(1 for s in range(1, steps + 1) if len(ids.get(s, [])) < 8)
    for k in ("failed", "redrawn", "dropped", "stale"):  # counters restart with a new trainer
        res[k] = sum(max((r.get(f"rollout/{k}", 0) for r in seg), default=0)
                     for seg in _segments(rows))
    res["lost"] = int(res["dropped"]) + 4 * res["short_steps"]
    res["final_version"] = rows[-1].get("rollout/version") if rows else None
    res["ids"] = ids
    return res


def _segments(rows: list[dict]) -> list[list[dict]]:
    """Metrics rows split where a restarted trainer's step count went back."""
    segs, cur, last = [], [], 0
    for r in rows:
        if r["step"] <= last and cur:
            segs.append(cur)
            cur = []
        cur.append(r)
        last = r["step"]
    return [*segs, cur] if cur else segs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="12 steps, async only")
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--json", default=None)
    p.add_argument("--root", default=None, help="work folder (default: a new temporary one)")
    args = p.parse_args(argv)
    from arealite.demo.tiny import build_tiny_model
    from arealite.demo.toy_math import write_toy_math

    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="chaos_"))
    model = build_tiny_model(root / "model")
    write_toy_math(root / "data", n_train=400, n_valid=4, seed=0)
    steps = 12 if args.quick else 16
    modes = [("async", "configs/toy_grpo.yaml", ["rollout.max_head_offpolicyness=1"])]
    if not args.quick:
        modes.append(("sync", "configs/toy_grpo_sync.yaml", []))
    report: dict[str, list] = {}
    bad = False
    for mode, config, extra in modes:
        over = [*small_run(model, root / "data", steps, epochs=1), "launcher.n_servers=2",
                "launcher.max_server_failures=1", "rollout.max_concurrent_rollouts=8",
                "weight_update.type=distributed", "recover.mode=auto", "recover.freq_steps=2",
                # small buckets: an update takes long enough to be caught inside (mid-update);
                # a bounded update: killed at the wrong moment, a broadcast waits out its timeout
                "weight_update.bucket_size_mb=0.05", "weight_update.timeout=60",
                "rollout.weight_update_timeout=60",
                *extra]
        base = run_one(None, config, root / mode, over, steps)
        rows = [base]
        for sc in args.scenarios.split(","):
            r = run_one(sc, config, root / mode, over, steps)
            if mode == "sync":
                r["same_data_order"] = all(sorted(r["ids"].get(s, [])) == sorted(base["ids"][s])
                                           for s in base["ids"])
            else:
                r["same_prompts"] = (Counter(i for v in r["ids"].values() for i in v)
                                     == Counter(i for v in base["ids"].values() for i in v))
            r["same_final_version"] = r["final_version"] == base["final_version"]
            rows.append(r)
            bad |= r["exit"] != 0 or r["lost"] != 0 or bool(r["left_behind"])
        report[mode] = rows
        print(f"\n{mode} (eta = {1 if mode == 'async' else 0}), {steps} steps, 2 servers:")
        print(f"{'scenario':24s} exit steps lost failed redrawn stale recover_s wall_s "
              "same_data final_v left")
        for r in rows:
            same = r.get("same_data_order", r.get("same_prompts", "-"))
            print(f"{r['scenario']:24s} {r['exit']:4d} {r['steps']:5d} {r['lost']:4d} "
                  f"{int(r['failed']):6d} {int(r['redrawn']):7d} {int(r['stale']):5d} "
                  f"{r.get('seconds_to_recover', '-')!s:>9s} {r['wall_s']:6.1f} "
                  f"{same!s:>9s} {r['final_version']!s:>7s} {len(r['left_behind']):4d}")
            for line in r["left_behind"]:
                print("   left behind:", line)
            if r["exit"] != 0:
                print(r.get("log", ""))
    if args.json:
        for rows in report.values():
            for r in rows:
                r["ids"] = {str(k): v for k, v in r["ids"].items()}
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
