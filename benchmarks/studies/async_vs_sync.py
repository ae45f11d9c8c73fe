"""Async versus sync GRPO at equal hardware, and the staleness ablation.

    python -m benchmarks.studies.async_vs_sync [--quick] [--steps N] [--runs sync,async-eta2,...]

Every run uses the same model (the main job's SFT warm start, built when missing), data,
hyperparameters, processes (one embedded server, one trainer, one torch thread each) and cores;
each goes through the local launcher (``arealite.launcher.local.main``) with its own
``trial_name`` under ``{fileroot}/bench-async-vs-sync[-quick]/``. Runs:

- ``sync``: ``async_training=false`` (``rollout_batch``; η = 0).
- ``async-eta1``, ``async-eta2``, ``async-eta4``: ``prepare_batch`` with η = 1, 2, 4.
- ``async-eta4-naive``: η = 4 with naive PPO: ``actor.use_decoupled_loss=false
  actor.recompute_logprob=false``, i.e. the standard clipped loss against the behaviour
  logprobs the servers reported (``arealite/engine/ppo/loss.py``), no proximal policy.

Workload: the toy arithmetic task with long-tailed generation lengths
(``benchmarks.studies.longtail_workflow``): a fraction ``--tail-fraction`` of the samples decode
``--tail-tokens`` tokens past EOS, the rest stop at EOS (~5 tokens).

Figures per run (definitions in ``benchmarks/harness/rl_metrics.py``): wall-clock to N steps, trained
tokens/s, trainer idle ratio (rollout_wait / step), rollout idle ratio (no episode in flight),
overlap efficiency (ideal pipelined time from the sync run's measured phase times ÷ achieved
time), staleness histogram and final held-out reward. Prints a markdown table with the
speedup over sync, the phase times, then the headline lines with their targets
(async/sync ≥ 2.8x at final reward within 5 %, overlap efficiency ≥ 0.9) and, when a target
is missed, where the time goes. Writes ``benchmarks/results/async_vs_sync/async_vs_sync[_quick].json`` and a
PNG of reward against wall-clock for every run.

Also times the trainer phases (recompute logp + PPO update) on one long-tailed batch at two
micro-batch token budgets (``--profile-budgets``). With ``attn_impl=sdpa``/``eager`` packed
micro-batches attend through a dense block-causal mask, quadratic in the budget; the default
(``segments``, per-sequence attention) grows with Σ Lᵢ² instead (``benchmarks/micro/trainer_step.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.longtail_runs import RUNS, launch_run
from benchmarks.harness.paths import ROOT, results_dir
from benchmarks.harness.run_probes import profile_trainer
from benchmarks.harness.warm_start import ensure_model

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TARGET_SPEEDUP, TARGET_OVERLAP, REWARD_TOL = 2.8, 0.9, 0.05


# --------------------------------------------------------------------------- report


def plot_curves(curves: dict[str, list[tuple[float, float]]], finals: dict[str, float | None], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    try:
        for name, pts in curves.items():
            if not pts:
                continue
            xs = [x for x, _ in pts]
            ys = [y for _, y in pts]
            w = max(1, len(ys) // 10)  # moving average over ~10% of the steps
            sm = [sum(ys[max(0, i - w + 1): i + 1]) / len(ys[max(0, i - w + 1): i + 1]) for i in range(len(ys))]
            (line,) = ax.plot(xs, sm, label=f"{name} (train reward, avg of {w})")
            if finals.get(name) is not None:
                ax.scatter([xs[-1]], [finals[name]], color=line.get_color(), marker="*", s=120, zorder=3)
        ax.set_xlabel("wall-clock seconds since the first step")
        ax.set_ylabel("reward")
        ax.set_title("reward against wall-clock (stars: final held-out accuracy)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        png.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(png, dpi=100, bbox_inches="tight")
    finally:
        plt.close(fig)


def headline(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The best async run (decoupled loss) among those with the final reward within 5 %."""
    cands = [n for n in runs if n.startswith("async") and not n.endswith("naive")]
    ok = [n for n in cands if runs[n]["reward_ok"] is not False] or cands
    best = max(ok, key=lambda n: runs[n]["speedup"]) if ok else None
    return {"run": best, "speedup": runs[best]["speedup"] if best else None,
            "overlap_efficiency": runs[best]["overlap_efficiency"] if best else None,
            "reward_vs_sync": runs[best]["reward_vs_sync"] if best else None}


def explain(runs: dict[str, dict[str, Any]], head: dict[str, Any], prof: list[dict[str, float]],
            use: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """Where the time goes, from the measured phase times (and the cores each process used)."""
    from benchmarks.harness.rl_metrics import overlap_bound

    s = runs["sync"]
    p = s["phases"]
    g, t = p["rollout_wait"], p["trainer"]
    lines = [
        f"sync step {p['step']:.3f} s = generate {g:.3f} s (the batch, to its longest sample) "
        f"+ train {t:.3f} s (logp {p['logp']:.3f}, update {p['update']:.3f}, weight sync "
        f"{p['weight_sync']:.3f}, other {p['other']:.3f}).",
        f"perfect overlap of those two phases bounds the speedup at (G+T)/max(G,T) = "
        f"{overlap_bound(s):.2f}x; anything above it must come from cheaper generation "
        "(continuous batching filling the long tail with the next batches' requests).",
    ]
    if head["run"]:
        r = runs[head["run"]]
        q = r["phases"]
        if r.get("steady_step_s") and s.get("steady_step_s"):
            lines.append(
                f"{head['run']}'s first step waits {r['first_wait_s']:.3f} s for the first batch (the "
                f"pipeline fill); after it, steps take {r['steady_step_s']:.3f} s against sync's "
                f"{s['steady_step_s']:.3f} s ({s['steady_step_s'] / r['steady_step_s']:.2f}x).")
        slow = q["trainer"] / max(t, 1e-9)
        why = (": the server generates on the other core meanwhile and the rollout loop thread "
               "shares the trainer's GIL" if slow > 1.05 else "")
        idle = r["rollout_idle"] if r["rollout_idle"] is not None else float("nan")
        lines.append(
            f"{head['run']}: step {q['step']:.3f} s, trainer phase {q['trainer']:.3f} s "
            f"({slow:.2f}x its sync cost{why}), trainer idle {r['trainer_idle']:.2f}, rollout idle "
            f"{idle:.2f}.")
    used = [(n, (use or {}).get(n, {}).get("cores")) for n in ("sync", head["run"]) if n]
    used = [(n, c) for n, c in used if c]
    if used:
        lines.append("cores used between the first and the last step (CPU seconds per second; the "
                     f"machine has {os.cpu_count()}): " + "; ".join(
                         f"{n}: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(c.items()))
                         + f" (total {sum(c.values()):.2f})" for n, c in used) + ".")
    if g >= t:
        lines.append("generation is the bottleneck here: async hides the trainer behind it, so the "
                     "speedup tends to (G+T)/G, and beyond that only through cheaper generation.")
    else:
        lines.append("the trainer is the bottleneck here: async can at best hide generation, so the "
                     "speedup tends to (G+T)/T. On GPUs generation dominates a sync RL step (long "
                     "reasoning samples decode token by token while training is a few large "
                     "matmuls), which is the regime where async pays most; the same code runs there "
                     "with device=cuda, NCCL and real SGLang servers on separate GPUs, so the two "
                     "phases stop competing for the same cores.")
    dec, naive = runs.get("async-eta4"), runs.get("async-eta4-naive")
    if dec and naive and dec.get("clip_ratio") is not None and naive.get("clip_ratio") is not None:
        lines.append(
            f"staleness ablation: the decoupled loss clips the ratio to the proximal policy, which "
            f"with one minibatch per step is the current policy itself, so nothing is clipped "
            f"(clip ratio {dec['clip_ratio']:.3f}) and its update is the policy gradient weighted by "
            f"the behaviour importance weight (masked above behav_imp_weight_cap); naive PPO clips "
            f"the ratio to the stale behaviour policy ({naive['clip_ratio']:.3f} of the tokens), a "
            f"trust region around the data. AReaL's setting has several minibatches per step, where "
            f"the proximal clip does bind: `benchmarks/studies/staleness_ablation.py` repeats this "
            f"comparison there (4 minibatches), over seeds.")
    if len(prof) >= 2:
        a, b = prof[0], prof[-1]
        ta, tb = a["logp"] + a["update"], b["logp"] + b["update"]
        lines.append(
            f"trainer profile (one long-tailed batch, {a['tokens']} tokens): micro-batch budget "
            f"{a['budget']} -> {ta:.3f} s, {b['budget']} -> {tb:.3f} s ({ta / max(tb, 1e-9):.2f}x) "
            "with the run's attention path (dense block-causal mask for sdpa/eager, quadratic in the "
            "budget; per-sequence segments or varlen flash attention otherwise).")
    return lines


def report(a: argparse.Namespace, metrics: dict[str, Path], prof: list[dict[str, float]], tag: str,
           machine_use: dict[str, dict[str, Any]] | None = None, prev: dict[str, Any] | None = None
           ) -> dict[str, Any]:
    from arealite.observe.stats_logger import read_metrics
    from benchmarks.harness.report import machine_info, machine_line
    from benchmarks.harness.rl_metrics import (
        compare,
        markdown_table,
        phase_table,
        reward_curve,
        summarize,
    )

    records = {n: read_metrics(p) for n, p in metrics.items()}
    runs = compare({n: summarize(r) for n, r in records.items()})
    head = headline(runs)
    machine = (prev or {}).get("machine") or machine_info()
    print(f"\nasync vs sync, {a.steps} steps, batch {a.batch_size} prompts x 8 samples, "
          f"{a.tail_fraction:.0%} of samples decode {a.tail_tokens} tokens past EOS "
          f"(machine: {machine_line(machine)})\n")
    table, phases = markdown_table(runs), phase_table(runs)
    print(table + "\n\nmean seconds per step:\n\n" + phases + "\n")
    if "async-eta4-naive" in runs:
        print("(async-eta4-naive skips the logprob recompute, so its steps are shorter for a reason "
              "other than overlap; it is there for its final reward.)\n")
    if head["run"]:
        ok = runs[head["run"]]["reward_ok"]
        cond = {True: "final reward within 5% of sync", False: "final reward NOT within 5% of sync",
                None: "final reward not measured"}[ok]
        print(f"async/sync speedup ({head['run']}, {cond}): "
              f"{head['speedup']:.2f}x (target >= {TARGET_SPEEDUP}x)")
        print(f"overlap efficiency ({head['run']}): {head['overlap_efficiency']:.2f} (target >= {TARGET_OVERLAP})")
        if head["reward_vs_sync"] is not None:
            print(f"final reward {head['run']} / sync: {head['reward_vs_sync']:.3f} (target >= {1 - REWARD_TOL})")
    abl = {n: runs[n].get("final_reward") for n in ("sync", "async-eta4", "async-eta4-naive") if n in runs}
    if len(abl) == 3 and all(v is not None for v in abl.values()):
        rel = {n: v / abl["sync"] if abl["sync"] else float("nan") for n, v in abl.items()}
        print(f"staleness ablation (eta=4, final held-out reward): decoupled loss {abl['async-eta4']:.3f} "
              f"({rel['async-eta4']:.2f} of sync), naive PPO {abl['async-eta4-naive']:.3f} "
              f"({rel['async-eta4-naive']:.2f} of sync), sync {abl['sync']:.3f}")
    why = explain(runs, head, prof, machine_use)
    print("\nwhere the time goes:\n" + "\n".join(f"- {w}" for w in why))
    curves = {n: reward_curve(r) for n, r in records.items()}
    png = Path(a.results_dir) / f"async_vs_sync{tag}.png"
    plot_curves(curves, {n: r.get("final_reward") for n, r in runs.items()}, png)
    result = {
        "benchmark": "async_vs_sync", "quick": a.quick, "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": machine, "command": " ".join(["python -m benchmarks.studies.async_vs_sync", *a.argv]),
        # --report-only keeps when, where and how the runs were measured
        **({k: prev[k] for k in ("date", "machine", "command") if k in prev} if prev else {}),
        "settings": {k: getattr(a, k) for k in ("steps", "batch_size", "tail_fraction", "tail_tokens",
                                                 "max_tokens_per_mb", "eval_prompts")},
        "targets": {"speedup": TARGET_SPEEDUP, "overlap_efficiency": TARGET_OVERLAP, "reward_tol": REWARD_TOL},
        "headline": head, "runs": runs, "machine_use": machine_use or {}, "trainer_profile": prof, "explanation": why,
        "table_md": table, "phases_md": phases, "reward_curves": curves,
    }
    result["command"] = result["command"].strip()
    out = Path(a.results_dir) / f"async_vs_sync{tag}.json"
    out.write_text(json.dumps(result, indent=1, default=float) + "\n")
    print(f"\nwrote {out} and {png}")
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="8 steps, 64 held-out prompts (a few minutes)")
    ap.add_argument("--steps", type=int, default=None, help="trainer steps per run (default 200; quick 8)")
    ap.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated subset of {list(RUNS)}")
    ap.add_argument("--batch-size", type=int, default=16, help="prompts per step (8 samples each)")
    ap.add_argument("--tail-fraction", type=float, default=0.1)
    ap.add_argument("--tail-tokens", type=int, default=128)
    ap.add_argument("--max-tokens-per-mb", type=int, default=256)
    ap.add_argument("--eval-prompts", type=int, default=None, help="held-out prompts (default all; quick 64)")
    ap.add_argument("--profile-budgets", default="4096,256", help="micro-batch budgets to profile ('' skips)")
    ap.add_argument("--fileroot", default="outputs")
    ap.add_argument("--model-path", default=None, help="policy to start from (default: the main job's SFT model)")
    ap.add_argument("--data-dir", default=None, help="folder with train.jsonl/valid.jsonl (default: toy task)")
    ap.add_argument("--results-dir", default=str(results_dir("async_vs_sync")),
                    help="where the JSON and PNG go")
    ap.add_argument("--results-tag", default=None, help="suffix of the result files (default '' or '_quick')")
    ap.add_argument("--verbose", action="store_true", help="stream the runs' logs")
    ap.add_argument("--report-only", action="store_true",
                    help="rebuild the table, JSON and PNG from the runs already under --fileroot")
    a = ap.parse_args(argv)
    a.argv = list(sys.argv[1:] if argv is None else argv)
    a.steps = a.steps or (8 if a.quick else 200)
    if a.quick and a.eval_prompts is None:
        a.eval_prompts = 64
    a.runs = [r.strip() for r in a.runs.split(",") if r.strip()]
    bad = [r for r in a.runs if r not in RUNS]
    if bad or "sync" not in a.runs:
        ap.error(f"--runs must include 'sync' and name only {list(RUNS)}; bad: {bad}")
    a.profile_budgets = [int(b) for b in a.profile_budgets.split(",") if b.strip()]
    if a.steps < 1 or a.batch_size < 1 or not 0 <= a.tail_fraction <= 1:
        ap.error("--steps and --batch-size must be >= 1, --tail-fraction in [0, 1]")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    a.fileroot = str(Path(a.fileroot).resolve())
    tag = a.results_tag if a.results_tag is not None else ("_quick" if a.quick else "")
    experiment = "bench-async-vs-sync" + ("-quick" if a.quick else "")
    if a.report_only:  # rebuild the figures from the runs already on disk
        old = Path(a.results_dir) / f"async_vs_sync{tag}.json"
        prev = json.loads(old.read_text()) if old.is_file() else {}
        metrics = {n: Path(a.fileroot) / experiment / n / "logs" / "metrics.jsonl" for n in a.runs}
        missing = [str(p) for p in metrics.values() if not p.is_file()]
        if missing:
            raise SystemExit(f"--report-only: no metrics at {missing}")
        report(a, metrics, prev.get("trainer_profile", []), tag, prev.get("machine_use"), prev)
        return 0
    # the trainer imports the workflow from benchmarks/, wherever this was started from
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    if a.model_path:
        model = Path(a.model_path).resolve()
        data = Path(a.data_dir).resolve() if a.data_dir else ensure_model(Path(a.fileroot))[1]
    else:
        model, data = ensure_model(Path(a.fileroot))
        data = Path(a.data_dir).resolve() if a.data_dir else data
    Path(a.results_dir).mkdir(parents=True, exist_ok=True)
    prof = profile_trainer(a.profile_budgets, model, a.tail_fraction, a.tail_tokens,
                           a.batch_size) if a.profile_budgets else []
    done = {name: launch_run(name, a, model, data, experiment) for name in a.runs}
    report(a, {n: m for n, (m, _) in done.items()}, prof, tag, {n: u for n, (_, u) in done.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
