"""Staleness ablation over seeds: does naive PPO degrade with stale data while the decoupled
loss does not (AReaL's finding)?

    python -m benchmarks.studies.staleness_ablation [--quick] [--steps N] [--seeds 1,2,3]
        [--ppo-minibatches M] [--eta E] [--resume]
        [--variant NAME:KEY=VALUE[,KEY=VALUE...]]... [--arms sync,decoupled,naive,NAME...]

For each seed, three runs of the ``async_vs_sync`` workload (the main job's SFT warm start, the
toy task with long-tailed generation lengths, one embedded server and one trainer), differing
only in the switches under test:

- ``sync``: η = 0 with the decoupled loss (on-policy: behaviour = proximal at the first
  minibatch);
- ``decoupled``: async, η = ``--eta``, the decoupled loss (ratio to the recomputed proximal
  policy, clipped; times the behaviour importance weight, capped);
- ``naive``: async, η = ``--eta``, naive PPO (the clipped ratio to the behaviour logprobs the
  servers reported; no recompute).

``--ppo-minibatches`` (default 4, as in AReaL's recipes) optimizer steps per trainer step: with
one, the proximal policy *is* the current one at the single update, so the decoupled loss never
clips and the comparison only tests the importance weight; with several, minibatches 2..M
are clipped against the proximal policy, the trust region the decoupled loss keeps and naive
PPO places around the stale behaviour policy instead. ``seed`` and the server's
``random_seed`` change with the seed; everything else is the same.

``--variant NAME:KEY=VALUE,...`` adds an arm: the ``decoupled`` run with those config overrides
last (a remedy under test, e.g. ``icepop:actor.behav_imp_weight_floor=0.5,
actor.behav_imp_weight_cap=2``); ``--arms`` picks the arms that run (default: sync, decoupled,
naive and every variant; sync always runs, every other arm is compared with it). Other arms than
the default three give the results file its own name (``_<arm>-<arm>...``), and the variants'
overrides are part of the settings ``--resume`` compares.

Prints the final held-out reward of every run, each configuration's mean and standard error
over seeds, and the paired (same seed) difference to sync; writes
``benchmarks/results/staleness_ablation/staleness_ablation[_quick][_lrLR][_etaE][_mbM][_stepsN][_<arms>].json``. ``--resume`` keeps the runs that file
already holds for the same settings and launches only the missing ones, so seeds can be added
(``--seeds 1,2,3,4,5 --resume``) without repeating the first three; the file is rewritten after
every finished run (marked ``partial`` until the summary), so an interrupted ablation resumes too.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.longtail_runs import launch_run
from benchmarks.harness.paths import ROOT, results_dir
from benchmarks.harness.warm_start import ensure_model

# configuration -> (the async_vs_sync run it builds on, its label)
CONFIGS = {"sync": "sync", "decoupled": "async-eta4", "naive": "async-eta4-naive"}
DEFAULT_MINIBATCHES = 4  # AReaL's recipes; configs/toy_grpo.yaml (the main job) has 1
DEFAULT_STEPS, QUICK_STEPS, DEFAULT_ETA = 200, 8, 4
TARGET_DECOUPLED = 0.95  # final reward of the decoupled loss at eta, relative to sync


def mean_se(xs: list[float]) -> tuple[float, float]:
    """Mean and standard error (0 for a single value)."""
    m = statistics.fmean(xs)
    return m, (statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else 0.0)


def run_figures(metrics: Path) -> dict[str, Any]:
    from arealite.observe.stats_logger import read_metrics
    from benchmarks.harness.rl_metrics import summarize

    s = summarize(read_metrics(metrics))
    return {k: s[k] for k in ("final_reward", "initial_reward", "eval_n", "train_reward_last",
                              "clip_ratio", "behave_kl", "staleness_hist", "wall_s", "length_ratio")}


def results_path(a: argparse.Namespace, tag: str) -> Path:
    """Where the results of these settings go (and where ``--resume`` reads them back)."""
    return Path(a.results_dir) / f"staleness_ablation{tag}.json"


SETTINGS = ("steps", "eta", "ppo_minibatches", "eval_prompts", "lr", "variants")


def arms(a: argparse.Namespace) -> list[str]:
    """The arms of these runs, sync first (the namespace of an older caller has the three)."""
    return list(getattr(a, "arms", None) or CONFIGS)


def results_tag(a: argparse.Namespace) -> str:
    """The results file's suffix: a learning rate other than the main job's, an η, minibatch or
    step count other than the default, or other arms than the default three each get their own file
    (and page entry); in a shared file ``--resume`` would start the other settings' runs afresh."""
    steps = QUICK_STEPS if a.quick else DEFAULT_STEPS
    return (("_quick" if a.quick else "") + (f"_lr{a.lr:g}" if a.lr else "")
            + (f"_eta{a.eta}" if a.eta != DEFAULT_ETA else "")
            + (f"_mb{a.ppo_minibatches}" if a.ppo_minibatches != DEFAULT_MINIBATCHES else "")
            + (f"_steps{a.steps}" if a.steps != steps else "")
            + ("" if arms(a) == list(CONFIGS) else "_" + "-".join(arms(a))))


def parse_variant(text: str) -> tuple[str, list[str]]:
    """``NAME:KEY=VALUE,KEY=VALUE`` -> (NAME, the overrides); a malformed one raises ValueError."""
    name, sep, rest = text.partition(":")
    overrides = [o.strip() for o in rest.split(",") if o.strip()]
    if not sep or not name.isidentifier() or name in CONFIGS or not overrides \
            or any("=" not in o or o.startswith("=") for o in overrides):
        raise ValueError(f"--variant {text!r}: expected NAME:KEY=VALUE[,KEY=VALUE...] with a new "
                         f"NAME (not {', '.join(CONFIGS)})")
    return name, overrides


def resumable_runs(path: Path, a: argparse.Namespace) -> dict[str, dict[int, dict[str, Any]]]:
    """The runs an earlier results file holds for the seeds asked for, when it was made with the
    same settings (a different setting makes them incomparable: none are kept, and it says so)."""
    runs: dict[str, dict[int, dict[str, Any]]] = {c: {} for c in arms(a)}
    if not path.exists():
        return runs
    old = json.loads(path.read_text())
    # a setting an older file lacks reads as None, as does an empty one; a variant is compared
    # arm by arm below, so another file's sync runs serve a new variant (--resume-from)
    differ = [k for k in SETTINGS if k != "variants"
              and (old.get("settings", {}).get(k) or None) != (getattr(a, k, None) or None)]
    if differ:
        print(f"--resume: {path} was made with other {', '.join(differ)}; starting afresh")
        return runs
    old_variants = old.get("settings", {}).get("variants") or {}
    for cfg in arms(a):
        if old_variants.get(cfg) != (getattr(a, "variants", None) or {}).get(cfg):
            continue  # another variant under this name (or a variant against a built-in arm)
        for seed, r in old.get("runs", {}).get(cfg, {}).items():
            if int(seed) in a.seeds:
                runs[cfg][int(seed)] = r
    kept = sorted({s for v in runs.values() for s in v})
    print(f"--resume: keeping {sum(map(len, runs.values()))} run(s) of seeds {kept} from {path}")
    return runs


def decoupled_vs_naive(summary: dict[str, Any], n_seeds: int) -> tuple[float, float, str]:
    """The decoupled loss's mean minus naive PPO's, its standard error, and what that says of
    AReaL's finding (a difference counts when it exceeds two standard errors)."""
    d, n = summary["decoupled"], summary["naive"]
    gap, gap_se = d["mean"] - n["mean"], math.hypot(d["se"], n["se"])
    if n_seeds < 2:
        return gap, gap_se, "not tested: one seed has no standard error"
    return gap, gap_se, ("reproduced" if gap > 2 * gap_se else "reversed" if gap < -2 * gap_se
                         else f"not resolved with {n_seeds} seeds")


def reproducing_argv(argv: list[str]) -> list[str]:
    """The arguments that decide the runs: without ``--resume`` or ``--resume-from`` (they only
    skipped some of them) or where the results were written."""
    out, skip = [], False
    for x in argv:
        if skip:
            skip = False
        elif x in ("--results-dir", "--resume-from"):
            skip = True
        elif x != "--resume" and not x.startswith(("--results-dir=", "--resume-from=")):
            out.append(x)
    return out


def report(a: argparse.Namespace, runs: dict[str, dict[int, dict[str, Any]]], tag: str) -> dict:
    from benchmarks.harness.report import machine_info

    arms_ = arms(a)
    # the seeds every arm finished (an interrupted ablation reports its complete seeds only)
    runs = {c: {s: r for s, r in runs[c].items() if all(s in runs[x] for x in arms_)} for c in arms_}

    seeds = sorted(runs["sync"])
    print(f"\nstaleness ablation: eta={a.eta}, {a.ppo_minibatches} minibatch(es) per step, "
          f"{a.steps} steps, seeds {seeds}\n")
    print("| run | " + " | ".join(f"seed {s}" for s in seeds) + " | mean ± SE | - sync (paired) |"
          " clip ratio | behaviour KL |")
    print("|---" * (len(seeds) + 5) + "|")
    summary: dict[str, Any] = {}
    for cfg in arms_:
        finals = [runs[cfg][s]["final_reward"] for s in seeds]
        diffs = [runs[cfg][s]["final_reward"] - runs["sync"][s]["final_reward"] for s in seeds]
        m, se = mean_se(finals)
        dm, dse = mean_se(diffs)
        clip = statistics.fmean(runs[cfg][s]["clip_ratio"] or 0.0 for s in seeds)
        kl = statistics.fmean(runs[cfg][s]["behave_kl"] or 0.0 for s in seeds)
        summary[cfg] = {"finals": finals, "mean": m, "se": se, "diff_mean": dm, "diff_se": dse,
                        "clip_ratio": clip, "behave_kl": kl}
        print(f"| {cfg} | " + " | ".join(f"{v:.3f}" for v in finals) + f" | {m:.3f} ± {se:.3f} | "
              + ("-" if cfg == "sync" else f"{dm:+.3f} ± {dse:.3f}") + f" | {clip:.3f} | {kl:.4f} |")
    sync_m = summary["sync"]["mean"]
    rel = {c: summary[c]["mean"] / sync_m if sync_m else float("nan") for c in arms_ if c != "sync"}
    # One seed (the quick mode) is a smoke run: its ratio is noise, so it is checked against
    # no target and the results page does not count it.
    target = (f"(target >= {TARGET_DECOUPLED})" if len(seeds) > 1
              else "(one seed: a smoke run, no target)")
    print()
    for cfg, r in rel.items():
        what = {"decoupled": "decoupled loss", "naive": "naive PPO"}.get(cfg, f"variant {cfg}")
        note = ("(AReaL's finding: below the decoupled loss)" if cfg == "naive" else target)
        over = f" [{', '.join(a.variants[cfg])}]" if cfg in getattr(a, "variants", {}) else ""
        print(f"{what} at eta={a.eta}, final reward / sync: {r:.3f} {note}{over}")
    gap, gap_se, verdict = (decoupled_vs_naive(summary, len(seeds))
                            if {"decoupled", "naive"} <= set(arms_) else (0.0, 0.0, "not run"))
    if verdict != "not run":
        print(f"decoupled - naive: {gap:+.3f} ± {gap_se:.3f} (AReaL's finding {verdict}: "
              "a difference counts when it exceeds two standard errors)")
    # The same comparison on the training reward of the last 10% of steps: sampled answers to
    # ~20x more prompts than the held-out evaluation, so less noisy, though a little biased
    # against the async runs (their samples come from policies up to eta versions old).
    train: dict[str, Any] = {}
    for cfg in arms_:
        vals = [runs[cfg][s]["train_reward_last"] for s in seeds]
        m, se = mean_se(vals)
        train[cfg] = {"values": vals, "mean": m, "se": se}
    tgap, tgap_se, tverdict = (decoupled_vs_naive(train, len(seeds))
                               if {"decoupled", "naive"} <= set(arms_) else (0.0, 0.0, "not run"))
    print("training reward, last 10% of steps (mean ± SE): " + ", ".join(
        f"{c} {v['mean']:.3f} ± {v['se']:.3f}" for c, v in train.items())
        + ("" if tverdict == "not run" else
           f"; decoupled - naive: {tgap:+.3f} ± {tgap_se:.3f} (AReaL's finding {tverdict})"))
    # whether the staleness gate trained shorter answers than were generated (issue #35's band
    # [0.97, 1.03]); runs recorded before the figure existed have none
    for cfg in arms_:
        ratios = [r for s in seeds if (r := runs[cfg][s].get("length_ratio")) is not None]
        summary[cfg]["length_ratio"] = statistics.fmean(ratios) if len(ratios) == len(seeds) else None
    if all(summary[c]["length_ratio"] is not None for c in arms_):
        print("trained / generated mean length, whole run (mean over seeds): " + ", ".join(
            f"{c} {summary[c]['length_ratio']:.3f} (seeds "
            f"{min(runs[c][s]['length_ratio'] for s in seeds):.3f}-"
            f"{max(runs[c][s]['length_ratio'] for s in seeds):.3f})" for c in arms_))
    result = {
        "benchmark": "staleness_ablation", "quick": a.quick, "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": machine_info(),
        # the command that reproduces every run (--resume only skipped some of them)
        "command": " ".join(["python -m benchmarks.studies.staleness_ablation",
                             *reproducing_argv(a.argv)]).strip(),
        "settings": {k: getattr(a, k, None) for k in (*SETTINGS, "seeds")}, "arms": arms_,
        "runs": {c: {str(s): r for s, r in v.items()} for c, v in runs.items()},
        "summary": summary, "relative_to_sync": rel, "decoupled_minus_naive": [gap, gap_se],
        "verdict": verdict, "train_reward": train,
        "decoupled_minus_naive_train": [tgap, tgap_se], "verdict_train": tverdict,
    }
    out = results_path(a, tag)
    out.write_text(json.dumps(result, indent=1, default=float) + "\n")
    print(f"\nwrote {out}")
    return result


def save_progress(a: argparse.Namespace, runs: dict[str, dict[int, dict[str, Any]]], tag: str) -> None:
    """The runs finished so far, in the results file with the settings ``--resume`` compares and
    no summary: an interrupted ablation (hours on a CPU) resumes from its last finished run."""
    results_path(a, tag).write_text(json.dumps({
        "benchmark": "staleness_ablation", "partial": True,
        "command": " ".join(["python -m benchmarks.studies.staleness_ablation",
                             *reproducing_argv(a.argv)]),
        "settings": {k: getattr(a, k, None) for k in (*SETTINGS, "seeds")}, "arms": arms(a),
        "runs": {c: {str(s): r for s, r in v.items()} for c, v in runs.items()},
    }, indent=1, default=float) + "\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="8 steps, one seed, 64 held-out prompts")
    ap.add_argument("--steps", type=int, default=None, help="trainer steps per run (default 200)")
    ap.add_argument("--seeds", default=None, help="comma-separated seeds (default 1,2,3; quick 1)")
    ap.add_argument("--eta", type=int, default=DEFAULT_ETA, help="max_head_offpolicyness of the async runs")
    ap.add_argument("--ppo-minibatches", type=int, default=DEFAULT_MINIBATCHES,
                    help="optimizer steps per trainer step (the main job runs 1)")
    ap.add_argument("--lr", type=float, default=None, help="learning rate (default: the main job's)")
    ap.add_argument("--eval-prompts", type=int, default=None, help="held-out prompts (default all)")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME:KEY=VALUE,...: an extra arm, the decoupled run with these overrides")
    ap.add_argument("--arms", default=None,
                    help="comma-separated arms to run (default sync,decoupled,naive + variants)")
    ap.add_argument("--fileroot", default="outputs")
    ap.add_argument("--results-dir", default=str(results_dir("staleness_ablation")))
    ap.add_argument("--resume", action="store_true",
                    help="keep the runs the results file holds for these settings; run the rest")
    ap.add_argument("--resume-from", default=None, metavar="PATH",
                    help="with --resume, also keep the matching runs of another results file "
                         "(e.g. sync runs made beside another variant)")
    ap.add_argument("--verbose", action="store_true", help="stream the runs' logs")
    a = ap.parse_args(argv)
    a.argv = list(sys.argv[1:] if argv is None else argv)
    a.steps = a.steps or (QUICK_STEPS if a.quick else DEFAULT_STEPS)
    a.seeds = [int(s) for s in (a.seeds or ("1" if a.quick else "1,2,3")).split(",") if s.strip()]
    if a.quick and a.eval_prompts is None:
        a.eval_prompts = 64
    if a.steps < 1 or not a.seeds or a.eta < 1 or a.ppo_minibatches < 1:
        ap.error("--steps, --eta and --ppo-minibatches must be >= 1, and --seeds non-empty")
    try:
        a.variants = dict(parse_variant(v) for v in a.variant)
    except ValueError as e:
        ap.error(str(e))
    known = [*CONFIGS, *a.variants]
    a.arms = ([x.strip() for x in a.arms.split(",") if x.strip()] if a.arms else known)
    if bad := [x for x in a.arms if x not in known]:
        ap.error(f"--arms: unknown arm(s) {', '.join(bad)} (known: {', '.join(known)})")
    a.arms = ["sync", *[x for x in dict.fromkeys(a.arms) if x != "sync"]]
    # the fixed parts of async_vs_sync's workload (its defaults)
    a.batch_size, a.tail_fraction, a.tail_tokens, a.max_tokens_per_mb = 16, 0.1, 128, 256
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    a.fileroot = str(Path(a.fileroot).resolve())
    tag = results_tag(a)
    experiment = "bench-staleness-ablation" + tag.replace("_", "-")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    model, data = ensure_model(Path(a.fileroot))
    Path(a.results_dir).mkdir(parents=True, exist_ok=True)
    runs = resumable_runs(results_path(a, tag), a) if a.resume else {c: {} for c in a.arms}
    if a.resume and a.resume_from:
        for cfg, got in resumable_runs(Path(a.resume_from), a).items():
            runs[cfg] = {**got, **runs[cfg]}
    for seed in a.seeds:
        common = (f"seed={seed}", f"servers.random_seed={seed}",
                  f"actor.ppo_n_minibatches={a.ppo_minibatches}",
                  *([f"actor.optimizer.lr={a.lr}"] if a.lr else []))
        for cfg in a.arms:
            if seed in runs[cfg]:
                continue
            # the async runs at --eta; sync keeps eta = 0; a variant's overrides come last
            extra = common if cfg == "sync" else (*common, f"rollout.max_head_offpolicyness={a.eta}",
                                                   *a.variants.get(cfg, ()))
            base = CONFIGS.get(cfg, CONFIGS["decoupled"])
            metrics, _ = launch_run(base, a, model, data, experiment, f"{cfg}-s{seed}", extra)
            runs[cfg][seed] = run_figures(metrics)
            print(f"   final held-out reward {runs[cfg][seed]['final_reward']}", flush=True)
            save_progress(a, runs, tag)
    report(a, runs, tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
