"""Per-step metrics to the console, ``metrics.jsonl``, tensorboard and (optionally) wandb.

Only rank 0 writes. The console line shows a fixed, compact subset in a fixed order (whichever
of ``CONSOLE_FIELDS`` exist in the step's stats); every key goes to the files. ``plot_metrics``
draws curves from ``metrics.jsonl`` into a PNG (matplotlib, Agg backend, no display needed).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from arealite.api.config.run import StatsLoggerConfig

# (label, candidate keys, format): the first candidate present in a step's stats is shown.
# The trainers record under these names; other keys still reach jsonl/tensorboard/wandb.
CONSOLE_FIELDS: list[tuple[str, tuple[str, ...], str]] = [
    ("reward", ("rollout/reward/avg", "task_reward/avg", "ppo_actor/task_reward/avg",
                "reward/avg", "reward"), "{:.3f}"),
    # held-out (observe/heldout_eval.py): right answers, paid in full, in format, mean reward;
    # an eval_fn's or the SFT trainer's accuracy
    ("right", ("eval/right",), "{:.3f}"),
    ("exact", ("eval/exact",), "{:.3f}"),
    ("format", ("eval/format",), "{:.3f}"),
    ("eval_score", ("eval/score", "eval/reward/avg"), "{:.3f}"),
    ("eval_acc", ("eval/accuracy", "valid/accuracy"), "{:.3f}"),
    ("loss", ("loss", "ppo_actor/loss", "sft/loss", "train/loss"), "{:.4f}"),
    ("stale", ("staleness/avg", "rollout/staleness/avg", "ppo_actor/staleness/avg"), "{:.2f}"),
    ("tok/s", ("perf/tokens_per_sec", "tokens_per_sec"), "{:.0f}"),
    ("step_s", ("timeperf/step", "timeperf/total"), "{:.2f}"),
]

JSONL_NAME = "metrics.jsonl"
# eval/ keys that are counts or references, not a grader's metrics (kept off the console line;
# so are the per-task eval/<task>/<name>)
EVAL_BOOKKEEPING = frozenset({"eval/n", "eval/rows_written", "eval/gold_majority_share"})
MAX_EVAL_EXTRA = 4


def _rank() -> int:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return int(os.environ.get("RANK", "0"))


def _finite_or_none(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None  # JSON has no NaN/inf; null keeps the line parseable everywhere
    return v


def format_console_line(step: int, stats: dict[str, float], total_steps: int | None = None) -> str:
    """``[##......] step 3/40 | reward 0.625 | eval_acc 0.810 | stale 0.50 | tok/s 1234``
    (the progress bar only when ``total_steps`` is known)."""
    parts = [f"step {step}" + (f"/{total_steps}" if total_steps else "")]
    if total_steps:
        done = round(20 * min(max(step, 0), total_steps) / total_steps)
        parts[0] = f"[{'#' * done}{'.' * (20 - done)}] " + parts[0]
    shown: set[str] = set()
    for label, keys, fmt in CONSOLE_FIELDS:
        key = next((k for k in keys if k in stats), None)
        if key is None:
            continue
        v = stats[key]
        shown.add(key)
        parts.append(f"{label} {fmt.format(v) if isinstance(v, (int, float)) and math.isfinite(v) else v}")
    # a grader's own metrics (evaluator.eval_fn returns them as eval/<name>) follow, by name
    extra = [k for k in sorted(stats) if k.startswith("eval/") and k not in shown
             and k not in EVAL_BOOKKEEPING and k.count("/") == 1
             and not k.endswith("_rows")][:MAX_EVAL_EXTRA]
    for k in extra:
        v = stats[k]
        parts.append(f"{k.removeprefix('eval/')} "
                     f"{f'{v:.3f}' if isinstance(v, (int, float)) and math.isfinite(v) else v}")
    return " | ".join(parts)


class StatsLogger:
    """Writes one record per step. ``log_dir`` gets ``metrics.jsonl`` and ``tensorboard/``.

    ``start_step``: when resuming from a checkpoint taken after step N, pass N so lines of
    steps > N written before the crash are dropped (those steps are run again)."""

    def __init__(
        self,
        config: StatsLoggerConfig,
        log_dir: str | os.PathLike,
        total_steps: int | None = None,
        run_name: str | None = None,
        run_config: dict[str, Any] | None = None,
        start_step: int | None = None,
        rank: int | None = None,
        write: Callable[[str], None] | None = None,
    ) -> None:
        self.config = config
        self.log_dir = Path(log_dir)
        self.total_steps = total_steps
        self.rank = _rank() if rank is None else rank
        self._write = write or _console_write
        self._t0 = time.monotonic()
        self._tb = None
        self._wandb = None
        self._jsonl = None
        self.last_step: int | None = start_step
        if self.rank != 0:
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        jsonl = self.log_dir / JSONL_NAME
        if start_step is not None and jsonl.exists():
            _truncate_after(jsonl, start_step)
        self._jsonl = open(jsonl, "a", buffering=1)
        if config.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.log_dir / "tensorboard"))
        if config.wandb_mode != "disabled":
            self._wandb = _init_wandb(config, self.log_dir, run_name, run_config)

    @property
    def jsonl_path(self) -> Path:
        return self.log_dir / JSONL_NAME

    def commit(self, step: int, stats: dict[str, float]) -> None:
        """Record the stats of ``step`` (a global step, increasing)."""
        if self.last_step is not None and step <= self.last_step:
            raise ValueError(f"step {step} logged after step {self.last_step}")
        self.last_step = step
        if self.rank != 0:
            return
        clean = {k: float(v) if not isinstance(v, (int, float)) else v for k, v in stats.items()}
        record = {"step": step, "elapsed_s": round(time.monotonic() - self._t0, 3)}
        record.update({k: _finite_or_none(v) for k, v in sorted(clean.items())})
        assert self._jsonl is not None
        self._jsonl.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for k, v in clean.items():
                if isinstance(v, (int, float)) and math.isfinite(v):
                    self._tb.add_scalar(k, v, global_step=step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(clean, step=step)
        if step % self.config.print_every == 0 or step == self.total_steps:
            self._write(format_console_line(step, clean, self.total_steps))

    def say(self, lines: list[str]) -> None:
        """Lines for the console (rank 0), beside the step lines (``sample_view``)."""
        if self.rank == 0:
            for line in lines:
                self._write(line)

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None

    def __enter__(self) -> StatsLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _console_write(line: str) -> None:
    # tqdm.write keeps a progress bar (if any) intact below the line.
    from tqdm import tqdm

    tqdm.write(line, file=sys.stdout)
    sys.stdout.flush()


def _truncate_after(path: Path, step: int) -> None:
    keep = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line).get("step", -1) <= step:
                keep.append(line)
        except json.JSONDecodeError:
            continue  # a line cut by a crash
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(x + "\n" for x in keep))
    os.replace(tmp, path)


def _init_wandb(config: StatsLoggerConfig, log_dir: Path, name: str | None, cfg: dict | None):
    try:
        import wandb
    except ImportError:
        print("stats_logger: wandb is not installed; wandb logging is off "
              "(pip install 'arealite[wandb]')", file=sys.stderr)
        return None
    return wandb.init(project=config.wandb_project, name=name, mode=config.wandb_mode,
                      dir=str(log_dir), config=cfg or {})


def read_metrics(jsonl_path: str | os.PathLike) -> list[dict[str, Any]]:
    """Records of a ``metrics.jsonl`` file (lines cut by a crash are skipped)."""
    out = []
    for line in Path(jsonl_path).read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def plot_metrics(
    jsonl_path: str | os.PathLike,
    out_png: str | os.PathLike,
    keys: Sequence[str] = ("rollout/reward/avg", "eval/right", "eval/accuracy"),
    title: str | None = None,
) -> Path:
    """Plot ``keys`` against ``step`` from a metrics file into ``out_png``; keys missing from
    every record are skipped, and it is an error if none is present."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(jsonl_path)
    series = {}
    for k in keys:
        pts = [(r["step"], r[k]) for r in records if r.get(k) is not None and "step" in r]
        if pts:
            series[k] = pts
    if not series:
        raise ValueError(f"none of {list(keys)} found in {jsonl_path}")
    fig, ax = plt.subplots(figsize=(7, 4))
    try:
        for k, pts in series.items():
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="o", markersize=3, label=k)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend()
        ax.set_title(title or Path(jsonl_path).parent.name)
        out = Path(out_png)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=100, bbox_inches="tight")
    finally:
        plt.close(fig)
    return out
