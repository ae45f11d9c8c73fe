"""The end-of-run summary every entry point prints (``arealite train``, the demo jobs): the
curve drawn from the metrics, where the outputs are (the held-out completions included) and
the last held-out evaluation's figures by their names."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from arealite.observe.heldout_eval import COMPLETIONS_FILE
from arealite.observe.stats_logger import plot_metrics, read_metrics

# curve key -> its name in the title (only the curves a run logged are drawn and named)
CURVES = {"reward": "reward", "eval/right": "held-out right", "eval/exact": "held-out exact",
          "eval/accuracy": "held-out accuracy (eval_fn)"}
LAST_EVAL = ("right", "exact", "format", "score", "accuracy")


def last_evaluation(records: list[dict]) -> str | None:
    """``step s: right r | exact e | ...`` of the last record holding a held-out figure, with
    the tasks that collapsed; None when the run logged none."""
    for r in reversed(records):
        figs = [(k, r[f"eval/{k}"]) for k in LAST_EVAL if isinstance(r.get(f"eval/{k}"), (int, float))]
        if figs:
            line = f"step {r.get('step')}: " + " | ".join(
                f"{k} {v:.3f}" if math.isfinite(v) else f"{k} {v}" for k, v in figs)
            collapsed = sorted(k.removeprefix("eval/").removesuffix("collapse").rstrip("/") or "all"
                               for k, v in r.items() if k.endswith("collapse") and v == 1.0)
            return line + (f" | COLLAPSE: {', '.join(collapsed)}" if collapsed else "")
    return None


def summarize_run(run_dir: Path, seconds: float, code: int, title: str,
                  write: Callable[[str], None] = print) -> Path | None:
    """Draw ``run_dir``'s reward and held-out curves and print where everything is; the PNG's
    path, or None when the run left no metrics."""
    logs = run_dir / "logs"
    metrics = logs / "metrics.jsonl"
    if not metrics.is_file():
        return None
    records = read_metrics(metrics)
    drawn = {k: n for k, n in CURVES.items() if any(r.get(k) is not None for r in records)}
    png = None
    if drawn:
        png = plot_metrics(metrics, run_dir / "reward_curve.png", keys=list(drawn),
                           title=f"{title}: {', '.join(drawn.values())}")
    write(f"\nDone in {seconds:.0f}s (exit {code}). Outputs:")
    write(f"  metrics:      {metrics}")
    if (logs / "tensorboard").is_dir():
        write(f"  tensorboard:  {logs / 'tensorboard'}")
    if png is not None:
        write(f"  reward curve: {png}")
    write(f"  checkpoints:  {run_dir / 'checkpoints'}")
    write(f"  logs:         {logs}")
    if (logs / COMPLETIONS_FILE).is_file():
        write(f"  held-out completions: {logs / COMPLETIONS_FILE}")
    last = last_evaluation(records)
    if last is not None:
        write(f"  last held-out evaluation, {last}")
    return png
