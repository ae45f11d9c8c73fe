"""The arms of a vs_trl run kept between its parts (``--max-arms``, ``--resume``): each finished
arm (one system, one seed) writes ``arm.json`` in its run folder, with the arguments its figures
depend on, and a later part reuses it only when they are the same."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.run_context import head_commit
from benchmarks.studies.vs_trl_figures import MEASURE

# The arguments an arm's figures depend on; an arm.json measured under other values is rerun.
ARM_ARGS = ("job", "quick", "seconds", "trl_seconds", "target", "prompts", "samples", "max_new_tokens", "lr",
            "eval_every", "eval_prompts", "override")


def arm_args(a: argparse.Namespace) -> dict[str, Any]:
    # the held-out figure the curves hold: arms measured in the mean score (before #56) are rerun
    return {**{k: getattr(a, k) for k in ARM_ARGS}, "measure": MEASURE}


def save_arm(folder: Path, a: argparse.Namespace, summary: dict[str, Any], load_start: float,
             load_during: dict[str, float] | None = None) -> None:
    """Keep a finished arm's figures, the arguments they came from and when and where they ran
    (``load_during``: ``LoadWatch.summary`` of the arm)."""
    record = {"args": arm_args(a), "summary": summary, "date": time.strftime("%Y-%m-%d %H:%M"),
              "commit": head_commit(), "load_average": [round(load_start, 1), round(os.getloadavg()[0], 1)]}
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
