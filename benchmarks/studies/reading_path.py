"""The reading path of one RL step and the files of one weight push, measured by running them
(issue #38's two path targets): ``python -m benchmarks.studies.reading_path``.

It runs the main job's GRPO config (``configs/toy_grpo.yaml``: tiny model, one embedded server,
one trainer, weights over a gloo broadcast) for one step through ``arealite.launcher.local``, as
``arealite main-job`` does after its warm start (the tiny model is built fresh in a temp folder,
so no SFT; the step's batch is 4 prompts x 2 samples, which takes the same code path as the job's
16 x 8), with every process tracing itself (``benchmarks/harness/line_trace.py``): launcher,
torchrun, trainer, server. ``--weight-update disk`` measures the disk push instead.

What it counts (the issue's definition: "modules / lines on the path of one RL step, entry script
-> loss -> weight push"; the exclusions are the previous hand trace's, kept so the figures compare):

- **reading path**: the modules of the ``arealite`` package that the *trainer process* ran a
  function of outside an import (importing a module is not reading it; options the config leaves
  off, e.g. vLLM, LoRA, critic, vision, colocation, are not counted because they never run),
  less the contracts (``arealite/api/``), the helpers several layers share (``arealite/utils/``)
  and observability (``arealite/observe/``), and less ``__init__`` files. "Lines" is the modules'
  whole length (what a reader opens); "ran" is how many of those lines executed (at run time).
  Printed with it, the part of that path that ran from the first ``rollout_batch`` on (what
  every step runs, and the run's end; the rest ran only in the set-up: engines, model load,
  the first evaluation, the consistency gate's build).
  The workflow (``workflows/``) and the launcher's and the server's modules are printed apart:
  they are other layers, not part of the step's path.
- **weight push files**: the ``arealite`` modules, with the same exclusions, that ran inside
  ``trainer/rl_engines.py:sync_weights`` (pause -> push -> resume) in the trainer process, including
  the client half it schedules on the rollout client's event loop (a context variable that
  asyncio's tasks inherit; the rollouts sharing that loop are not counted), and their folders.
  The server side of the push (the weight routes in ``servers/routes/control.py`` and the engine
  work they queue) is printed apart.

Results: ``benchmarks/results/reading_path/<weight update type>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness.grpo_runs import launcher_cmd, log_tail, wait_exit
from benchmarks.harness.line_trace import trace_env
from benchmarks.harness.paths import ROOT, results_dir

CONFIG = "configs/toy_grpo.yaml"
PACKAGE = "arealite/"
EXCLUDED = ("arealite/api/", "arealite/utils/", "arealite/observe/")
TRAINER_WINDOW = "arealite/trainer/rl_engines.py:sync_weights"
SERVER_WINDOW = [
    f"servers/routes/control.py:{f}"
    for f in (
        "pause_generation",
        "continue_generation",
        "update_weights_from_disk",
        "init_weights_update_group",
        "destroy_weights_update_group",
        "begin_weight_update",
        "end_weight_update",
        "update_weights_from_distributed",
        "update_weight_version",
        "get_weights_by_name",
        "work",
    )
]  # `work`: what the two update routes queue to the engine
STEP_MARK = "arealite/trainer/rl_engines.py:rollout_batch"  # the first phase of a step
TARGETS = {"modules": 12, "lines": 3500, "push_files": 8, "push_folders": 2}


@dataclass
class Module:
    path: str
    lines: int  # the file's length
    ran: int  # its lines that executed


def role(argv: list[str]) -> str:
    """Which process of the run a trace came from, by its command line."""
    text = " ".join(argv)
    if "arealite.trainer." in text and "distributed.run" not in text and "torchrun" not in text:
        return "trainer"
    if "servers.launch_server" in text:
        return "server"
    if "arealite.launcher.local" in text:
        return "launcher"
    return "other"


def counted(path: str, package: str = PACKAGE, excluded: tuple[str, ...] = EXCLUDED) -> bool:
    """On the reading path's count: in ``package``, outside ``excluded``, not an ``__init__``."""
    return (
        path.startswith(package)
        and not path.startswith(excluded)
        and not path.endswith("__init__.py")
    )


def modules(
    ran: dict[str, list[int]], length: Callable[[str], int], keep: Callable[[str], bool]
) -> list[Module]:
    """The modules of ``ran`` (path -> executed lines) that ``keep`` accepts, longest first."""
    rows = [Module(p, length(p), len(lines)) for p, lines in ran.items() if lines and keep(p)]
    return sorted(rows, key=lambda m: (-m.lines, m.path))


def folders(mods: list[Module]) -> list[str]:
    return sorted({str(Path(m.path).parent) for m in mods})


def summary(mods: list[Module]) -> dict[str, Any]:
    return {
        "modules": len(mods),
        "lines": sum(m.lines for m in mods),
        "ran": sum(m.ran for m in mods),
        "folders": folders(mods),
        "list": [asdict(m) for m in mods],
    }


def file_length(path: str) -> int:
    with open(ROOT / path, "rb") as f:
        return sum(1 for _ in f)


def merge(dumps: list[dict[str, Any]], key: str) -> dict[str, list[int]]:
    """The union of several processes' ``key`` traces (two servers, two trainer ranks)."""
    out: dict[str, set[int]] = {}
    for d in dumps:
        for path, lines in d.get(key, {}).items():
            out.setdefault(path, set()).update(lines)
    return {p: sorted(v) for p, v in out.items()}


def measure(
    dumps: list[dict[str, Any]], length: Callable[[str], int] = file_length
) -> dict[str, Any]:
    """The study's figures from the processes' traces."""
    by_role: dict[str, list[dict[str, Any]]] = {}
    for d in dumps:
        by_role.setdefault(role(d["argv"]), []).append(d)
    trainer = by_role.get("trainer", [])
    if not trainer:
        raise ValueError("no trace from a trainer process")
    run, window, step = (
        merge(trainer, "run"),
        merge(trainer, "window"),
        merge(trainer, "after_mark"),
    )
    servers = by_role.get("server", [])
    return {
        "path": summary(modules(run, length, counted)),
        "step": summary(modules(step, length, counted)),
        "path_excluded": summary(modules(run, length, lambda p: p.startswith(EXCLUDED))),
        "workflows": summary(modules(run, length, lambda p: p.startswith("workflows/"))),
        "push": summary(modules(window, length, counted)),
        "push_excluded": summary(modules(window, length, lambda p: p.startswith(EXCLUDED))),
        "server_push": summary(modules(merge(servers, "window"), length, lambda p: True)),
        "server": summary(modules(merge(servers, "run"), length, lambda p: True)),
        "launcher": summary(
            modules(
                merge(by_role.get("launcher", []), "run"), length, lambda p: p.startswith(PACKAGE)
            )
        ),
    }


def table(title: str, s: dict[str, Any]) -> str:
    rows = [
        f"{title}: {s['modules']} modules, {s['lines']} lines ({s['ran']} ran) in "
        f"{len(s['folders'])} folders"
    ]
    rows += [f"  {m['lines']:5d} {m['ran']:5d}  {m['path']}" for m in s["list"]]
    return "\n".join(rows)


def report(fig: dict[str, Any], weight_update: str) -> str:
    p, w = fig["path"], fig["push"]
    return "\n".join(
        [
            "       lines  ran  module",
            table(
                "reading path of one RL step (trainer process; arealite/ less api/, utils/, "
                "observe/, __init__)",
                p,
            ),
            table(
                "  of which ran from the first rollout_batch on (what every step runs; the set-up"
                " ran the rest)",
                fig["step"],
            ),
            table("  ran too, not counted (api/, utils/, observe/)", fig["path_excluded"]),
            table("  ran too, not counted (the workflow layer)", fig["workflows"]),
            table(f"one weight push ({weight_update}; trainer's sync_weights, same exclusions)", w),
            table(
                "  ran in the push too, not counted (api/, utils/, observe/)", fig["push_excluded"]
            ),
            table(
                "  the server's side of the push (weight routes and their engine work)",
                fig["server_push"],
            ),
            f"launcher process: {fig['launcher']['modules']} arealite modules ran, "
            f"server process: {fig['server']['modules']} servers/ modules ran",
            f"reading path modules: {p['modules']} (target <= {TARGETS['modules']})",
            f"reading path lines: {p['lines']} (target <= {TARGETS['lines']})",
            f"reading path from the first step on: {fig['step']['modules']} modules, "
            f"{fig['step']['lines']} lines",
            f"weight push files: {w['modules']} (target <= {TARGETS['push_files']})",
            f"weight push folders: {len(w['folders'])} (target <= {TARGETS['push_folders']})",
        ]
    )


def run_traced(root: Path, weight_update: str | None, timeout: float) -> list[dict[str, Any]]:
    """One traced GRPO step through the local launcher; the processes' traces."""
    from arealite.demo.main_job import build_assets

    assets = root / "assets"
    build_assets(assets)
    env = {
        **os.environ,
        **trace_env(
            root / "site",
            root / "traces",
            [ROOT / "arealite", ROOT / "servers", ROOT / "workflows"],
            [TRAINER_WINDOW, *SERVER_WINDOW],
            ROOT,
            [STEP_MARK],
        ),
    }
    over = [
        f"actor.path={assets / 'tiny_model'}",
        f"train_dataset.path={assets / 'toy_math' / 'train.jsonl'}",
        f"valid_dataset.path={assets / 'toy_math' / 'valid.jsonl'}",
        "total_train_steps=1",
        "train_dataset.batch_size=4",
        "gconfig.n_samples=2",
        "actor.group_size=2",
        "rollout.consumer_batch_size=4",
    ]
    if weight_update:
        over.append(f"weight_update.type={weight_update}")
    log = root / "run.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(
            launcher_cmd(CONFIG, root, "reading-path", over),
            stdout=f,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=env,
            start_new_session=True,
        )
        try:
            code = wait_exit(proc, str(log), timeout)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
    if code != 0:
        raise RuntimeError(f"the traced run failed (exit {code}):\n{log_tail(str(log), 40)}")
    time.sleep(1.5)  # the last one-second flushes of processes stopped by signal
    return [json.loads(p.read_text()) for p in sorted((root / "traces").glob("*.json"))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--weight-update",
        default=None,
        choices=["distributed", "disk"],
        help="the push to trace (default: the config's, distributed)",
    )
    p.add_argument(
        "--quick", action="store_true", help="the same run (one step is already the short form)"
    )
    p.add_argument("--timeout", type=float, default=900.0, help="seconds for the traced run")
    p.add_argument("--root", default=None, help="work folder (default: a new temporary one)")
    p.add_argument(
        "--json",
        default=None,
        help="results file (default: benchmarks/results/reading_path/<weight update type>.json)",
    )
    a = p.parse_args(argv)
    root = Path(a.root) if a.root else Path(tempfile.mkdtemp(prefix="reading_path_"))
    load = os.getloadavg()[0]
    try:
        fig = measure(run_traced(root, a.weight_update, a.timeout))
    except (RuntimeError, ValueError, AssertionError) as e:
        print(f"reading_path: {e}", file=sys.stderr)
        return 1
    finally:
        if not a.root:
            shutil.rmtree(root, ignore_errors=True)
    kind = a.weight_update or "distributed"
    print(report(fig, kind), flush=True)
    out = Path(a.json) if a.json else results_dir("reading_path") / f"{kind}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {"weight_update": kind, "load_avg": round(load, 1), "targets": TARGETS, **fig}, indent=1
        )
        + "\n"
    )
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
