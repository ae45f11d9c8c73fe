"""The arms of a vs_trl run kept between its parts (``--max-arms``, ``--resume``): each finished
arm (one system, one seed) writes ``arm.json`` in its run folder, with the arguments its figures
depend on, and a later part reuses it only when they are the same."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.paths import ROOT

# The arguments an arm's figures depend on; an arm.json measured under other values is rerun.
ARM_ARGS = ("job", "quick", "seconds", "target", "prompts", "samples", "max_new_tokens", "lr",
            "eval_every", "eval_prompts", "override")


def arm_args(a: argparse.Namespace) -> dict[str, Any]:
    return {k: getattr(a, k) for k in ARM_ARGS}


class LoadWatch:
    """The machine's 1-minute load average sampled every ``every`` seconds while an arm runs:
    its start and end alone miss whatever else ran in between (an arm is up to an hour)."""

    def __init__(self, every: float = 30.0) -> None:
        self.every, self.samples = every, [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> LoadWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])

    def summary(self) -> dict[str, float]:
        s = self.samples
        return {"mean": round(sum(s) / len(s), 2), "max": round(max(s), 2), "samples": len(s)}


def save_arm(folder: Path, a: argparse.Namespace, summary: dict[str, Any], load_start: float,
             load_during: dict[str, float] | None = None) -> None:
    """Keep a finished arm's figures, the arguments they came from and when and where they ran
    (``load_during``: ``LoadWatch.summary`` of the arm)."""
    record = {"args": arm_args(a), "summary": summary, "date": time.strftime("%Y-%m-%d %H:%M"),
              "commit": _commit(), "load_average": [round(load_start, 1), round(os.getloadavg()[0], 1)]}
    if load_during is not None:
        record["load_during"] = load_during
    (folder / "arm.json").write_text(json.dumps(record, indent=1))


def load_arm(folder: Path, a: argparse.Namespace) -> dict[str, Any] | None:
    """The arm.json in ``folder`` when it was measured with this run's arguments, else None."""
    try:
        record = json.loads((folder / "arm.json").read_text())
    except (OSError, ValueError):
        return None
    return record if record.get("args") == json.loads(json.dumps(arm_args(a))) else None


def _commit() -> str:
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else "unknown"
