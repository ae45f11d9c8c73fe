"""Figures of one GRPO run, from its ``metrics.jsonl`` records, and the comparison table of the
async-vs-sync benchmark. Pure functions over lists of dicts (tested in tests/benchmarks/).

Definitions (N = number of trainer steps, i = one step, all times in seconds):

- ``wall_s``: wall-clock of the N steps: ``elapsed_s`` of step N-1 minus that of step 0 (the
  record written after the initial held-out evaluation), plus step N's own ``timeperf/step``.
  Start-up (servers, model load) and the final evaluation are outside it.
- ``tokens_per_s``: tokens the trainer ran forward/backward on (prompt + generated, the batch's
  ``attention_mask`` sum: ``perf/tokens_per_sec * timeperf/step`` per step) over ``wall_s``.
- ``trainer_idle``: sum of ``timeperf/rollout_wait`` over sum of ``timeperf/step``: the share of
  its time the trainer waits for trajectories.
- ``rollout_idle``: sum of ``rollout/idle_s`` over ``wall_s``: the share of time with no episode in
  flight (``arealite.rollout.executor.WorkflowExecutor.idle_stats``).
- phase times: per-step means of ``rollout_wait`` (G when the run is sync), ``logp``, ``update``,
  ``weight_sync`` and ``other`` (step minus the four: saving, statistics, logging). The trainer
  phase T = step - rollout_wait.
- overlap efficiency of a run, against the sync run's phases Ḡ (mean rollout_wait, a batch
  generated with nothing else running) and T̄ (mean trainer phase, trained with nothing else
  running): ``ideal = N * max(Ḡ, T̄) + min(Ḡ, T̄)`` is the time of a perfect two-stage pipeline
  (the slower stage never waits; one fill of the faster one), and ``efficiency = ideal / wall_s``.
  1.0 means the async run hides the faster phase completely at no cost to the slower one; below
  1, overlapping costs something (contention for cores, the GIL, the staleness gate blocking).
  It can exceed 1 when async generation is cheaper than sync generation (continuous batching
  fills the long tail with the next batches' requests). The speedup pure overlap can give is
  ``(Ḡ + T̄) / max(Ḡ, T̄)`` <= 2.
- ``staleness_hist``: token-weighted share of trained tokens generated k versions before the
  weights being updated (``staleness/hist_k`` weighted by each step's ``n_tokens``).
- ``steady_step_s``: mean step time without step 1 (in an async run, step 1 waits for the first
  batch: the pipeline fill, ``first_wait_s``).
- ``final_reward``: held-out greedy mean reward (``eval/score``) after the last step;
  ``train_reward_last``: mean training reward over the last 10% of steps.
- ``length_ratio``: the whole run's trained / generated mean length
  (``length_bias/run_mean_ratio`` of the last step that has it, ``arealite.observe.length_bias``;
  None in metrics without it).
"""

from __future__ import annotations

import math
from typing import Any

Record = dict[str, Any]

PHASES = ("rollout_wait", "logp", "update", "weight_sync")


def _steps(records: list[Record]) -> list[Record]:
    return sorted((r for r in records if r.get("step", 0) >= 1 and "timeperf/step" in r),
                  key=lambda r: r["step"])


def _get(r: Record, key: str, default: float = 0.0) -> float:
    v = r.get(key)
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else default


def _mean_of(steps: list[Record], key: str) -> float | None:
    vals = [float(r[key]) for r in steps if isinstance(r.get(key), (int, float))]
    return sum(vals) / len(vals) if vals else None


def wall_clock(records: list[Record]) -> float:
    steps = _steps(records)
    if not steps:
        raise ValueError("no step records (with timeperf/step) in the metrics")
    start = next((_get(r, "elapsed_s") for r in records if r.get("step") == 0), 0.0)
    if len(steps) == 1:
        return _get(steps[0], "timeperf/step")
    return _get(steps[-2], "elapsed_s") - start + _get(steps[-1], "timeperf/step")


def reward_curve(records: list[Record], key: str = "reward") -> list[tuple[float, float]]:
    """(seconds since the first step started, value) per step: x is the step's end time."""
    steps = _steps(records)
    start = next((_get(r, "elapsed_s") for r in records if r.get("step") == 0), 0.0)
    out = []
    for i, r in enumerate(steps):
        if key not in r or r[key] is None:
            continue
        # elapsed_s of a step is written after its step time; the last one may include the
        # final evaluation, so it is rebuilt from the previous record as in wall_clock.
        end = (_get(steps[i - 1], "elapsed_s") - start if i else 0.0) + _get(r, "timeperf/step")
        out.append((end, float(r[key])))
    return out


def summarize(records: list[Record]) -> dict[str, Any]:
    """The figures of one run (see the module docstring)."""
    steps = _steps(records)
    wall = wall_clock(records)
    n = len(steps)
    step_sum = sum(_get(r, "timeperf/step") for r in steps)
    phases = {p: sum(_get(r, f"timeperf/{p}") for r in steps) / n for p in PHASES}
    phases["step"] = step_sum / n
    phases["other"] = max(0.0, phases["step"] - sum(phases[p] for p in PHASES))
    phases["trainer"] = phases["step"] - phases["rollout_wait"]
    tokens = sum(_get(r, "perf/tokens_per_sec") * _get(r, "timeperf/step") for r in steps)
    idle = [r["rollout/idle_s"] for r in steps if isinstance(r.get("rollout/idle_s"), (int, float))]
    weights = [_get(r, "n_tokens", 1.0) or 1.0 for r in steps]
    hist: dict[int, float] = {}
    for r, w in zip(steps, weights):
        for k, v in r.items():
            if k.startswith("staleness/hist_") and isinstance(v, (int, float)):
                j = int(k.rsplit("_", 1)[1])
                hist[j] = hist.get(j, 0.0) + w * float(v)
    total_w = sum(weights)
    hist = {k: v / total_w for k, v in sorted(hist.items())}
    tail = steps[-max(1, n // 10):]
    evals = [r for r in records if isinstance(r.get("eval/score"), (int, float))]
    return {
        "steps": n,
        "wall_s": wall,
        "step_s": phases["step"],
        # without the first step, whose rollout_wait is the pipeline fill in async runs
        "steady_step_s": (step_sum - _get(steps[0], "timeperf/step")) / (n - 1) if n > 1 else None,
        "first_wait_s": _get(steps[0], "timeperf/rollout_wait"),
        "tokens": tokens,
        "tokens_per_s": tokens / wall if wall > 0 else 0.0,
        "trainer_idle": sum(_get(r, "timeperf/rollout_wait") for r in steps) / step_sum if step_sum else 0.0,
        "rollout_idle": (sum(idle) / wall) if idle and wall > 0 else None,
        "phases": phases,
        "staleness_hist": hist,
        "staleness_max": max((_get(r, "staleness/max") for r in steps), default=0.0),
        "initial_reward": evals[0]["eval/score"] if evals and evals[0].get("step") == 0 else None,
        "final_reward": evals[-1]["eval/score"] if evals and evals[-1].get("step", 0) >= 1 else None,
        "eval_n": evals[-1].get("eval/n") if evals else None,
        "train_reward_last": sum(_get(r, "reward") for r in tail) / len(tail),
        "gen_len": sum(_get(r, "gen_len") for r in steps) / n,
        "seq_len_max": max(_get(r, "seq_len/max") for r in steps),
        # PPO diagnostics for the staleness ablation: tokens clipped, behaviour-policy KL
        "clip_ratio": _mean_of(steps, "clip_ratio"),
        "behave_kl": _mean_of(steps, "behave_kl_vs_current"),
        # cumulative, so the last step's value covers the run
        "length_ratio": next((float(r["length_bias/run_mean_ratio"]) for r in reversed(steps)
                              if isinstance(r.get("length_bias/run_mean_ratio"), (int, float))), None),
    }


def overlap_efficiency(run: dict[str, Any], sync: dict[str, Any]) -> float:
    """``ideal / wall`` with the ideal pipelined time built from the sync run's phase times."""
    g, t = sync["phases"]["rollout_wait"], sync["phases"]["trainer"]
    ideal = run["steps"] * max(g, t) + min(g, t)
    return ideal / run["wall_s"] if run["wall_s"] > 0 else 0.0


def overlap_bound(sync: dict[str, Any]) -> float:
    """The speedup a perfect overlap of the sync run's two phases would give."""
    g, t = sync["phases"]["rollout_wait"], sync["phases"]["trainer"]
    return (g + t) / max(g, t, 1e-12)


def reward_ok(run: dict[str, Any], sync: dict[str, Any], tol: float = 0.05) -> bool | None:
    """Final held-out reward within ``tol`` (relative) of sync's, or better; None if unknown."""
    a, b = run.get("final_reward"), sync.get("final_reward")
    if a is None or b is None:
        return None
    return a >= b * (1 - tol)


def compare(runs: dict[str, dict[str, Any]], sync_name: str = "sync") -> dict[str, dict[str, Any]]:
    """Adds ``speedup`` (sync wall / run wall), ``overlap_efficiency``, ``reward_vs_sync`` and
    ``reward_ok`` to every run (copies)."""
    if sync_name not in runs:
        raise KeyError(f"no {sync_name!r} run to compare with")
    sync = runs[sync_name]
    out = {}
    for name, r in runs.items():
        r = dict(r)
        r["speedup"] = sync["wall_s"] / r["wall_s"] if r["wall_s"] > 0 else 0.0
        r["overlap_efficiency"] = overlap_efficiency(r, sync)
        fr, fs = r.get("final_reward"), sync.get("final_reward")
        r["reward_vs_sync"] = (fr / fs) if fr is not None and fs else None
        r["reward_ok"] = reward_ok(r, sync)
        out[name] = r
    return out


def _fmt(v: Any, spec: str = ".2f") -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return format(v, spec)


def staleness_text(hist: dict[int, float]) -> str:
    return " ".join(f"{k}:{v:.2f}" for k, v in sorted(hist.items()) if v >= 0.005) or "-"


def markdown_table(runs: dict[str, dict[str, Any]], labels: dict[str, str] | None = None) -> str:
    """One row per run (after ``compare``)."""
    labels = labels or {}
    head = ("| run | wall s | speedup vs sync | tokens/s | trainer idle | rollout idle | "
            "overlap eff. | staleness hist (k:share) | final reward | vs sync |")
    lines = [head, "|" + "|".join(["---"] * 10) + "|"]
    for name, r in runs.items():
        lines.append("| " + " | ".join([
            labels.get(name, name), _fmt(r["wall_s"], ".1f"), _fmt(r.get("speedup"), ".2f") + "x",
            _fmt(r["tokens_per_s"], ".0f"), _fmt(r["trainer_idle"]), _fmt(r.get("rollout_idle")),
            _fmt(r.get("overlap_efficiency")), staleness_text(r["staleness_hist"]),
            _fmt(r.get("final_reward"), ".3f"), _fmt(r.get("reward_vs_sync"), ".3f"),
        ]) + " |")
    return "\n".join(lines)


def phase_table(runs: dict[str, dict[str, Any]], labels: dict[str, str] | None = None) -> str:
    """Mean seconds per step of each phase, per run: where the time goes."""
    labels = labels or {}
    cols = ("step", "rollout_wait", "logp", "update", "weight_sync", "other")
    lines = ["| run | " + " | ".join(cols) + " | gen len | longest seq |",
             "|" + "|".join(["---"] * (len(cols) + 3)) + "|"]
    for name, r in runs.items():
        p = r["phases"]
        lines.append("| " + " | ".join([labels.get(name, name), *(f"{p[c]:.3f}" for c in cols),
                                        f"{r['gen_len']:.1f}", f"{r['seq_len_max']:.0f}"]) + " |")
    return "\n".join(lines)
