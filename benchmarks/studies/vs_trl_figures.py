"""The figures of a vs_trl run (``benchmarks/studies/vs_trl.py``), pure functions of the arms'
summaries: an arm's key and label, time to the target right share (held-out right answers) and its evaluation-grid bound,
the arealite / TRL ratios per seed, of the means over seeds and on the seeds' mean curves, the
table, the headline lines the results page reads (``benchmarks/harness/report.py``), the page
entry, a part's report and the mean-score plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TARGET_STEP_RATIO, TARGET_TTA_RATIO = 0.7, 0.5
LABELS = {"trl": "TRL GRPOTrainer", "async": "arealite async (eta=2)", "sync": "arealite sync"}
Curve = list[tuple[float, float]]  # (training seconds, held-out right: the share of right answers)
MEASURE = "eval/right"  # arealite's key for it (arealite.observe.heldout_eval)


def run_key(name: str, seed: int, seeds: list[int]) -> str:
    """A run's key (and trial folder): the system's name, ``-sN`` added when several seeds run."""
    return name if len(seeds) == 1 else f"{name}-s{seed}"


def split_key(key: str) -> tuple[str, int | None]:
    """``async-s2`` -> (``async``, 2); ``trl-1t`` -> (``trl-1t``, None)."""
    head, _, tail = key.rpartition("-s")
    return (head, int(tail)) if head and tail.isdigit() else (key, None)


def label(key: str) -> str:
    """``trl-2t`` -> ``TRL GRPOTrainer, 2 threads``; arealite's names from LABELS; a seed
    suffix (``-s2``) -> ``, seed 2``."""
    name, seed = split_key(key)
    return _label(name) + ("" if seed is None else f", seed {seed}")


def _label(name: str) -> str:
    if name.startswith("trl-") and name.endswith("t"):
        n = name[4:-1]
        return f"{LABELS['trl']}, {n} thread{'' if n == '1' else 's'}"
    return LABELS.get(name, name)


def time_to_target(curve: Curve, target: float) -> float | None:
    """Training seconds of the first evaluation at or above ``target`` (None: never reached)."""
    # accuracies come as float32 means (0.7 arrives as 0.69999998): compare with a tolerance
    return next((t for t, acc in sorted(curve) if acc >= target - 1e-6), None)


def last_below(curve: Curve, target: float) -> float | None:
    """Training seconds of the last evaluation before the first at or above ``target``: the run
    crossed the target between it and ``time_to_target``. None when it never reached it, or
    reached it at its first evaluation."""
    hit = time_to_target(curve, target)
    before = [t for t, _ in sorted(curve) if hit is not None and t < hit]
    return before[-1] if before else None


def grid_note(ours_hit: float, theirs_below: float | None) -> str:
    """Each side is evaluated every ``--eval-every`` of its own steps, so the slower side's
    evaluations are further apart and its first crossing is seen later: the ratio with the
    other side at its last evaluation below the target bounds what the grid can hide."""
    if not theirs_below:
        return ""
    return f" [at most {ours_hit / theirs_below:.2f}x with TRL at its last evaluation below the target]"


def tta_ratio(ours: dict[str, Any], theirs: dict[str, Any]) -> tuple[float | None, str]:
    """Time-to-target ratio ours / theirs and how to read it: ``exact``; ``upper bound`` when
    only ours reached it (theirs would take longer than its whole budget); ``lower bound`` when
    only theirs did (ours took longer than its whole training time); None when neither did."""
    a, b = ours.get("tta_s"), theirs.get("tta_s")
    if a is not None and b is not None:
        return (a / b if b > 0 else None), "exact"
    if a is not None and theirs.get("train_s"):
        return a / theirs["train_s"], "upper bound"
    if b is not None and b > 0 and ours.get("train_s"):
        return ours["train_s"] / b, "lower bound"
    return None, "not reached"


def arealite_summary(records: list[dict[str, Any]], target: float) -> dict[str, Any]:
    """Figures of an arealite run from its metrics.jsonl records."""
    steps = sorted((r for r in records if r.get("step", 0) >= 1 and "timeperf/step" in r), key=lambda r: r["step"])
    if not steps:
        raise ValueError("no step records in the metrics")
    curve: Curve = [(0.0 if r["step"] == 0 else float(r.get("timeperf/train_elapsed", 0.0)), float(r[MEASURE]))
                    for r in records if isinstance(r.get(MEASURE), (int, float))]
    train_s = float(steps[-1]["timeperf/train_elapsed"])
    n = len(steps)
    phases = {p: sum(float(r.get(f"timeperf/{p}", 0.0)) for r in steps) / n
              for p in ("rollout_wait", "logp", "update", "weight_sync")}
    return finish({"steps": n, "train_s": train_s, "curve": curve, "phases": phases}, target)


def trl_summary(result: dict[str, Any], target: float) -> dict[str, Any]:
    """Figures of the TRL run from ``benchmarks/studies/trl_grpo.py``'s result JSON."""
    curve: Curve = [(float(row[1]), float(row[2])) for row in result["curve"]]  # [step, s, right, ...]
    return finish({"steps": int(result["steps"]), "train_s": float(result["train_s"]), "curve": curve,
                   "phases": dict(result.get("phases", {}))}, target)


def finish(s: dict[str, Any], target: float) -> dict[str, Any]:
    s["step_s"] = s["train_s"] / s["steps"] if s["steps"] else None
    s["tta_s"] = time_to_target(s["curve"], target)
    s["final_acc"] = s["curve"][-1][1] if s["curve"] else None
    s["best_acc"] = max((acc for _, acc in s["curve"]), default=None)
    return s


def _f(v: Any, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def table(runs: dict[str, dict[str, Any]], target: float) -> str:
    rows = ["| system | steps | training s | s / step | phases (s / step) | held-out right: initial → final (best) "
            f"| s to {target:.2f} |", "|---|---|---|---|---|---|---|"]
    for name, s in runs.items():
        ph = ", ".join(f"{k} {v:.3f}" for k, v in s["phases"].items())
        acc = f"{_f(s['curve'][0][1] if s['curve'] else None)} → {_f(s['final_acc'])} ({_f(s['best_acc'])})"
        rows.append(f"| {label(name)} | {s['steps']} | {s['train_s']:.1f} | {_f(s['step_s'], '.3f')} "
                    f"| {ph} | {acc} | {_f(s['tta_s'], '.1f')} |")
    return "\n".join(rows)


def best_trl(runs: dict[str, dict[str, Any]]) -> tuple[str, str] | None:
    """TRL at its best among its thread counts: (the fastest per step, the earliest to the
    target); None without a TRL run."""
    trls = {k: v for k, v in runs.items() if k == "trl" or k.startswith("trl-")}
    if not trls:
        return None
    fast = min(trls, key=lambda k: trls[k]["step_s"] or float("inf"))
    first = min(trls, key=lambda k: (trls[k]["tta_s"] is None, trls[k]["tta_s"] or 0.0, -trls[k]["train_s"]))
    return fast, first


def headlines(runs: dict[str, dict[str, Any]], target: float) -> list[str]:
    """The ratio lines (``... VALUE (target ...)``, read by ``benchmarks/harness/report.py``). With
    several seeds: each seed's lines (no target), then the means over seeds (the targets)."""
    seeds = sorted({split_key(k)[1] or 0 for k in runs})
    by_seed = {seed: {split_key(k)[0]: v for k, v in runs.items() if (split_key(k)[1] or 0) == seed} for seed in seeds}
    if len(seeds) <= 1:
        return seed_headlines(runs, target, targets=True) + speedup_lines(by_seed)
    out = [f"seed {seed}: {line}" for seed in seeds for line in seed_headlines(by_seed[seed], target, targets=False)]
    return out + mean_headlines(by_seed, target) + mean_curve_headlines(by_seed, target) + speedup_lines(by_seed)


def speedup_lines(by_seed: dict[int, dict[str, dict[str, Any]]]) -> list[str]:
    """arealite's own async speed-up: sync seconds per step / async seconds per step, per seed and
    of the means, the figure AReaL reports (2.77x on GPUs, where generation dominates the step)."""
    both = {seed: runs for seed, runs in by_seed.items()
            if runs.get("async", {}).get("step_s") and runs.get("sync", {}).get("step_s")}
    if not both:
        return []
    out = [("" if len(by_seed) == 1 else f"seed {seed}: ") + "arealite sync / async seconds per step (speed-up of "
           f"async): {r['sync']['step_s'] / r['async']['step_s']:.2f}x (no target; AReaL reports 2.77x)"
           for seed, r in sorted(both.items())]
    if len(both) > 1:
        ratio = sum(r["sync"]["step_s"] for r in both.values()) / sum(r["async"]["step_s"] for r in both.values())
        out.append(f"arealite sync / async seconds per step (speed-up of async, mean over seeds "
                   f"{','.join(map(str, sorted(both)))}): {ratio:.2f}x (no target; AReaL reports 2.77x)")
    return out


def seed_headlines(runs: dict[str, dict[str, Any]], target: float, targets: bool) -> list[str]:
    """The ratio lines of one seed's runs (keys without a seed suffix)."""
    best = best_trl(runs)
    if best is None:
        return []
    fast, first = best
    out = []
    for name in ("async", "sync"):
        if name not in runs:
            continue
        s, tag = runs[name], "" if name == "async" and targets else " (no target)"
        trl = runs[fast]
        if s["step_s"] and trl["step_s"]:
            line = f"arealite {name} / TRL seconds per step: {s['step_s'] / trl['step_s']:.2f}x"
            out.append(line + (f" (target <= {TARGET_STEP_RATIO})" if not tag else tag) + f" [{label(fast)}]")
        trl = runs[first]
        ratio, how = tta_ratio(s, trl)
        what = f"arealite {name} / TRL time to {target:.2f} held-out right"
        if ratio is None:
            out.append(f"{what}: {how} (arealite {_f(s['tta_s'], '.1f')} s, TRL {_f(trl['tta_s'], '.1f')} s)")
        else:
            note = {"upper bound": f" [an upper bound: TRL did not reach it in {trl['train_s']:.0f} s]",
                    "lower bound": f" [a lower bound: arealite {name} did not reach it in {s['train_s']:.0f} s]",
                    }.get(how, "")
            grid = grid_note(s["tta_s"], last_below(trl["curve"], target)) if how == "exact" else ""
            out.append(f"{what}: {ratio:.2f}x" + (f" (target <= {TARGET_TTA_RATIO})" if not tag else tag)
                       + note + grid + f" [{label(first)}]")
    return out


def mean_headlines(by_seed: dict[int, dict[str, dict[str, Any]]], target: float) -> list[str]:
    """Ratios of the means over seeds (TRL at its best in each seed): seconds per step, and
    time to ``target`` when every run of both sides reached it."""
    seeds = sorted(by_seed)
    best = {seed: best_trl(runs) for seed, runs in by_seed.items()}
    if any(b is None for b in best.values()):
        return []
    over = f"(mean over seeds {','.join(map(str, seeds))})"
    out = []
    for name in ("async", "sync"):
        if any(name not in by_seed[seed] for seed in seeds):
            continue
        ours = [by_seed[seed][name] for seed in seeds]
        fast = [by_seed[seed][best[seed][0]] for seed in seeds]
        first = [by_seed[seed][best[seed][1]] for seed in seeds]
        targets = name == "async"
        if all(r["step_s"] for r in ours + fast):
            ratio = sum(r["step_s"] for r in ours) / sum(r["step_s"] for r in fast)
            out.append(f"arealite {name} / TRL seconds per step {over}: {ratio:.2f}x"
                       + (f" (target <= {TARGET_STEP_RATIO})" if targets else " (no target)"))
        what = f"arealite {name} / TRL time to {target:.2f} held-out right {over}"
        # a run that never reached the target counts with its whole training time (a bound, as
        # tta_ratio's): only one side may miss it, and the line says which way the bound goes
        ours_miss, trl_miss = (any(r["tta_s"] is None for r in rs) for rs in (ours, first))
        theirs = sum(r["tta_s"] if r["tta_s"] is not None else r["train_s"] for r in first)
        if (ours_miss and trl_miss) or theirs <= 0:
            out.append(f"{what}: not reached in every seed (arealite {[_f(r['tta_s'], '.1f') for r in ours]} s, "
                       f"TRL {[_f(r['tta_s'], '.1f') for r in first]} s)")
            continue
        ratio = sum(r["tta_s"] if r["tta_s"] is not None else r["train_s"] for r in ours) / theirs
        below = [last_below(r["curve"], target) for r in first]
        note = (" [an upper bound: TRL did not reach it in every seed]" if trl_miss else
                f" [a lower bound: arealite {name} did not reach it in every seed]" if ours_miss else
                grid_note(sum(r["tta_s"] for r in ours), sum(below) if all(below) else None))
        out.append(f"{what}: {ratio:.2f}x" + (f" (target <= {TARGET_TTA_RATIO})" if targets else " (no target)") + note)
    return out


def curve_at(curve: Curve, t: float) -> float:
    """The held-out right share at training second ``t``, linear between evaluations (``t`` within
    the curve's span)."""
    pts = sorted(curve)
    for (t0, a0), (t1, a1) in zip(pts, pts[1:]):
        if t0 <= t <= t1:
            return a1 if t1 == t0 else a0 + (a1 - a0) * (t - t0) / (t1 - t0)
    if pts and t == pts[0][0]:
        return pts[0][1]
    raise ValueError(f"{t} s is outside the curve's evaluations ({pts[0][0]}-{pts[-1][0]} s)")


def mean_curve(curves: list[Curve]) -> Curve:
    """The seeds' held-out right share averaged at each training second, each seed's curve linear
    between its evaluations, up to the shortest run's last evaluation. Given at every seed's
    evaluation times (where the mean can bend), so it is exact between them too."""
    end = min(max(t for t, _ in c) for c in curves)
    times = sorted({t for c in curves for t, _ in c if t <= end})
    return [(t, sum(curve_at(c, t) for c in curves) / len(curves)) for t in times]


def crossing(curve: Curve, target: float) -> float | None:
    """The first training second at which ``curve``, linear between its points, reaches
    ``target`` (None: never)."""
    pts = sorted(curve)
    if pts and pts[0][1] >= target - 1e-6:
        return pts[0][0]
    for (t0, a0), (t1, a1) in zip(pts, pts[1:]):
        if a1 >= target - 1e-6:
            return t0 + (t1 - t0) * (target - a0) / (a1 - a0)
    return None


def mean_curve_headlines(by_seed: dict[int, dict[str, dict[str, Any]]], target: float) -> list[str]:
    """Time to ``target`` on the seeds' mean curves (``mean_curve``), arealite / TRL: when the
    average run reaches it. The mean of the first crossings (``mean_headlines``) counts a run
    that touches the target for one evaluation and falls back as reaching it; this counts the
    right share a run holds. When TRL's mean curve never reaches the target, the ratio is an upper
    bound, and the line adds the time each side's mean curve takes to TRL's mean-curve best."""
    seeds = sorted(by_seed)
    best = {seed: best_trl(runs) for seed, runs in by_seed.items()}
    if len(seeds) < 2 or any(b is None for b in best.values()):
        return []
    trl = mean_curve([by_seed[seed][best[seed][1]]["curve"] for seed in seeds])
    trl_hit, trl_end = crossing(trl, target), trl[-1][0]
    peak_t, peak = max(trl, key=lambda p: (p[1], -p[0]))
    out = []
    for name in ("async", "sync"):
        if any(name not in by_seed[seed] for seed in seeds):
            continue
        ours = mean_curve([by_seed[seed][name]["curve"] for seed in seeds])
        hit = crossing(ours, target)
        what = (f"arealite {name} / TRL time to {target:.2f} held-out right on the mean curve over seeds "
                f"{','.join(map(str, seeds))}")
        if hit is None:
            out.append(f"{what}: not reached by arealite {name}'s mean curve in {ours[-1][0]:.0f} s "
                       f"(TRL's: {_f(trl_hit, '.0f')} s)")
            continue
        if trl_hit is not None:
            out.append(f"{what}: {hit / trl_hit:.2f}x (no target) [{hit:.0f} s against {trl_hit:.0f} s]"
                       if trl_hit > 0 else f"{what}: both at once")
            continue
        to_peak = crossing(ours, peak)
        peak_note = (f"; arealite {name}'s reaches that best at {to_peak:.0f} s: {to_peak / peak_t:.2f}x"
                     if to_peak is not None and peak_t > 0 else "")
        out.append(f"{what}: {hit / trl_end:.2f}x (no target) [an upper bound: TRL's mean curve did not reach "
                   f"it in {trl_end:.0f} s, its best {peak:.3f} at {peak_t:.0f} s{peak_note}]")
    return out


def page_entry(r: dict[str, Any], file: str = "vs_trl.json") -> dict[str, Any]:
    """A saved full run (``benchmarks/results/vs_trl/<file>``) as a row group of the results page."""
    from benchmarks.harness.report import parse_figures

    a = r["args"]
    job = ", SmolLM2 on reasoning-gym (--job real)" if a.get("job") == "real" else ""
    # which code measured arealite's side: a run in parts can be older than the code on the page
    commits = sorted({arm["commit"] for key, arm in r.get("arms", {}).items() if not key.startswith("trl")})
    at = f" (arealite's arms at {', '.join(commits)})" if commits else ""
    trl_s = a.get("trl_seconds") or a["seconds"]
    budget = (f"{a['seconds']:.0f} training s each" if trl_s == a["seconds"]
              else f"{a['seconds']:.0f} training s, TRL {trl_s:.0f}")
    return {"name": f"vs_trl{job}, last full run ({budget}, target {a['target']})",
            "command": r["command"], "status": f"ran {r['date']}{at}", "seconds": None,
            "figures": [f.as_dict() for f in parse_figures("vs_trl", "\n".join(r["headlines"]))],
            "notes": [*r["table"].splitlines(), *r["headlines"]],
            "about": f"{a['prompts']} prompts x {a['samples']} samples per step, max {a['max_new_tokens']} new "
                     f"tokens, lr {a['lr']}; TRL torch threads: {a['trl_threads']}. All figures in "
                     f"`benchmarks/results/vs_trl/{file}`."}


def report_part(runs: dict[str, dict[str, Any]], keys: list[str], left: list[str], target: float) -> None:
    """What a part of a run has so far: the table of its finished arms, and the ratio lines of
    the seeds whose every arm is finished (no results file: that is written by the whole run)."""
    done = [k for k in keys if k in runs]
    if not done:
        return
    print(table({k: runs[k] for k in done}, target) + "\n")
    whole = {split_key(k)[1] for k in done} - {split_key(k)[1] for k in left}
    for seed in sorted(s for s in whole if s is not None):
        seed_runs = {split_key(k)[0]: runs[k] for k in done if split_key(k)[1] == seed}
        for line in seed_headlines(seed_runs, target, targets=False) + speedup_lines({seed: seed_runs}):
            print(f"seed {seed}: {line}")


def plot(runs: dict[str, dict[str, Any]], target: float, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    try:
        for name, s in runs.items():
            ax.plot([t for t, _ in s["curve"]], [acc for _, acc in s["curve"]], marker=".", label=label(name))
        ax.axhline(target, color="grey", ls="--", lw=0.8)
        ax.set_xlabel("training seconds (evaluations excluded)")
        ax.set_ylabel("held-out greedy right answers (share)")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.savefig(png, dpi=100, bbox_inches="tight")
    finally:
        plt.close(fig)
