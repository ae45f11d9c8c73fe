"""The RL variants on the main job's task, from the same SFT start, one after the other.

    python -m benchmarks.studies.variants [--quick] [--seconds S] [--variants grpo,dapo,...]

Every variant trains the main job's policy (its SFT warm start, built as ``make run`` builds it
when missing) on the main job's task with the main job's config (``configs/toy_grpo.yaml``:
async, eta = 2, 16 prompts x 8 samples, lr 2e-4 cosine over the main job's 375 steps), the
same seed, through the local launcher, for ``--seconds`` of training time (evaluations
excluded: the trainer's ``timeperf/train_elapsed``). Only the keys in ``VARIANTS`` differ
(formulas: ``docs/algorithms.md``). Held-out greedy accuracy (the whole held-out set unless
``--eval-prompts``) is measured every ``--eval-every`` steps. Prints two tables: accuracy at
fixed training seconds (``--points``), which machine load bends, and at fixed step counts
(``--step-points``), which it does not; with each run's mean 1-minute load average. Writes
``benchmarks/results/variants/variants[_TAG].json`` and a PNG of both curves.

The trainer takes one PPO minibatch per step (the main job's setting), so the policy being
trained equals the proximal policy when the loss is computed: the ratio is 1, no clip binds,
and PPO, CISPO and DAPO's clip-higher give the same gradient; ``--minibatches 4`` makes the
clips matter. ``ppo_gae`` is the main job plus a critic (``critic``: a value head on the SFT
model's backbone, trained on the returns every step), so GAE subtracts a learned per-token
baseline instead of none.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.paths import ROOT, results_dir
from benchmarks.harness.run_context import LoadWatch

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

RESULTS = results_dir("variants")
CONFIG = ROOT / "configs" / "toy_grpo.yaml"
MAX_NEW = "{max_new_tokens}"  # filled from the run's gconfig.max_new_tokens
# name -> (what it is, the actor keys it sets on top of the main job's config)
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "main": ("the main job as is: reward on every token, normalised over the batch; PPO clip", []),
    "grpo": ("GRPO: (r - group mean) / group std", ["actor.adv_estimator=grpo"]),
    "dr_grpo": ("Dr.GRPO: r - group mean; token sum / max_new_tokens",
                ["actor.adv_estimator=dr_grpo", "actor.loss_agg_mode=seq_mean_token_sum_norm",
                 f"actor.loss_agg_norm={MAX_NEW}"]),
    "ppo_gae": ("PPO with a learned critic: GAE (lambda = gamma = 1) over its values, "
                "normalised over the batch; critic lr 1e-3",
                ["actor.adv_estimator=gae", "critic.optimizer.lr=1e-3"]),
    "rloo": ("RLOO: leave-one-out group baseline", ["actor.adv_estimator=rloo"]),
    "reinforce_pp": ("REINFORCE++: r normalised over the batch (the main job's formula)",
                     ["actor.adv_estimator=reinforce_pp"]),
    "gspo": ("GRPO advantages, GSPO sequence ratio, clip 3e-4/4e-4, sequence mean",
             ["actor.adv_estimator=grpo", "actor.policy_loss=gspo", "actor.eps_clip=3e-4",
              "actor.eps_clip_higher=4e-4", "actor.loss_agg_mode=seq_mean_token_mean"]),
    "cispo": ("GRPO advantages, CISPO loss, IS weight clipped to [0, 1.28]",
              ["actor.adv_estimator=grpo", "actor.policy_loss=cispo", "actor.eps_clip=1.0",
               "actor.eps_clip_higher=0.28"]),
    "dapo": ("GRPO advantages, clip-higher 0.28, dynamic sampling, overlong penalty past "
             "max_new_tokens - 4",
             ["actor.adv_estimator=grpo", "actor.eps_clip_higher=0.28", "actor.dynamic_sampling=true",
              f"actor.overlong_max_len={MAX_NEW}", "actor.overlong_buffer_len=4"]),
}
Curve = list[tuple[int, float, float]]  # (step, training seconds, held-out accuracy)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="20 training s per variant, 64 held-out prompts")
    p.add_argument("--seconds", type=float, default=None, help="training seconds per variant (default 240)")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, from {list(VARIANTS)}")
    p.add_argument("--points", default=None, help="training seconds of the first table (default "
                   "30,60,120,240, those within --seconds)")
    p.add_argument("--step-points", default=None, help="steps of the second table (default: "
                   "--eval-every times 1, 2, 4, 8, ...)")
    p.add_argument("--eval-every", type=int, default=None, help="steps between evaluations (default 20; quick 5)")
    p.add_argument("--eval-prompts", type=int, default=None, help="held-out prompts (default all; quick 64)")
    p.add_argument("--max-steps", type=int, default=None, help="step cap and lr schedule length "
                   "(default: the main job's, epochs x rows / prompts)")
    p.add_argument("--minibatches", type=int, default=1, help="PPO minibatches per step (main job: 1)")
    p.add_argument("--prompts", type=int, default=None, help="prompts per step (default: the config's)")
    p.add_argument("--samples", type=int, default=None, help="samples per prompt (default: the config's)")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="a config key for every variant, after the variant's own (repeatable)")
    p.add_argument("--seed", type=int, default=1, help="seed of the trainer, data order and servers")
    p.add_argument("--config", default=str(CONFIG), help="the GRPO config every variant starts from")
    p.add_argument("--fileroot", default=str(ROOT / "outputs"))
    p.add_argument("--model-path", default=None, help="policy to start from (default: the main job's SFT model)")
    p.add_argument("--data-dir", default=None, help="folder with train.jsonl/valid.jsonl (default: toy task)")
    p.add_argument("--results-dir", default=str(RESULTS))
    p.add_argument("--tag", default=None, help="results file suffix (default: quick or none)")
    p.add_argument("--verbose", action="store_true", help="stream the runs' logs")
    p.add_argument("--report-only", action="store_true",
                   help="rebuild the tables, JSON and PNG from the last results JSON, running nothing")
    a = p.parse_args(argv)
    a.argv = list(sys.argv[1:] if argv is None else argv)
    a.seconds = a.seconds if a.seconds is not None else (20.0 if a.quick else 240.0)
    a.eval_every = a.eval_every or (5 if a.quick else 20)
    if a.eval_prompts is None and a.quick:
        a.eval_prompts = 64
    a.variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    bad = [v for v in a.variants if v not in VARIANTS]
    if bad or not a.variants:
        p.error(f"--variants: unknown {bad or 'empty list'}; choose from {', '.join(VARIANTS)}")
    if any("=" not in o for o in a.override):
        p.error("--override: KEY=VALUE")
    if a.seconds <= 0 or a.eval_every < 1 or a.minibatches < 1 or (a.max_steps is not None and a.max_steps < 1):
        p.error("--seconds > 0; --eval-every, --minibatches and --max-steps >= 1")
    try:
        pts = [float(x) for x in (a.points or "").split(",") if x.strip()]
        a.step_points = [int(x) for x in (a.step_points or "").split(",") if x.strip()]
    except ValueError:
        p.error("--points and --step-points: comma-separated numbers")
    default = [x for x in (30.0, 60.0, 120.0, 240.0) if x < a.seconds] + [a.seconds]
    quick = [a.seconds / 4, a.seconds / 2, a.seconds]
    a.points = sorted(set(pts or (quick if a.quick else default)))
    if min(a.points) <= 0 or any(s < 0 for s in a.step_points):
        p.error("--points must be > 0 and --step-points >= 0")
    return a


# --------------------------------------------------------------------------- pure figures


def variant_overrides(name: str, max_new_tokens: int) -> list[str]:
    return [o.replace(MAX_NEW, str(max_new_tokens)) for o in VARIANTS[name][1]]


def curve_of(records: list[dict[str, Any]]) -> Curve:
    """(step, training seconds, accuracy) of every held-out evaluation, step 0 at 0 s."""
    out = [(int(r.get("step", 0)), 0.0 if r.get("step", 0) == 0 else float(r["timeperf/train_elapsed"]),
            float(r["eval/score"]))
           for r in records if isinstance(r.get("eval/score"), (int, float))]
    return sorted(out)


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    steps = [r for r in records if r.get("step", 0) >= 1 and "timeperf/train_elapsed" in r]
    if not steps:
        raise ValueError("no step records in the metrics")
    last = max(steps, key=lambda r: r["step"])
    curve = curve_of(records)
    n, train_s = int(last["step"]), float(last["timeperf/train_elapsed"])
    drop = [float(r["dynamic_sampling/drop_ratio"]) for r in steps if "dynamic_sampling/drop_ratio" in r]
    return {"steps": n, "train_s": train_s, "step_s": train_s / n, "curve": curve,
            "initial_acc": curve[0][2] if curve and curve[0][0] == 0 else None,
            "final_acc": curve[-1][2] if curve else None,
            "best_acc": max((c[2] for c in curve), default=None),
            "drop_ratio": sum(drop) / len(drop) if drop else None}


def acc_at_seconds(s: dict[str, Any], t: float, budget: float) -> float | None:
    """Accuracy of the last evaluation at or before ``t`` training seconds (at ``t >= budget``:
    the final one, taken when the step that used up the budget ended); None when the run
    trained less than ``t`` seconds (it hit the step cap) or was not evaluated by then."""
    if s["train_s"] < t - 1e-6:
        return None
    if t >= budget:
        return s["final_acc"]
    before = [acc for _, secs, acc in s["curve"] if secs <= t + 1e-6]
    return before[-1] if before else None


def acc_at_step(s: dict[str, Any], step: int) -> float | None:
    return next((acc for st, _, acc in s["curve"] if st == step), None)


def default_step_points(runs: dict[str, dict[str, Any]], eval_every: int) -> list[int]:
    """0, then eval_every x 1, 2, 4, ... and the last multiple of eval_every that every run
    reached (so the last column compares them all)."""
    common = min((s["steps"] for s in runs.values()), default=0) // eval_every * eval_every
    pts, k = [0], 1
    while eval_every * k < common:
        pts.append(eval_every * k)
        k *= 2
    return pts + ([common] if common else [])


def noise_pairs(minibatches: int) -> list[tuple[str, str]]:
    """Variants that compute the same update, so their gap is run-to-run noise: ``main`` and
    ``reinforce_pp`` always (the same advantages); ``grpo`` and ``cispo`` with one minibatch
    per step (the ratio to the proximal policy is 1, where PPO's and CISPO's gradients agree)."""
    return [("main", "reinforce_pp")] + ([("grpo", "cispo")] if minibatches == 1 else [])


def noise_gap(runs: dict[str, dict[str, Any]], points: list[int], pairs: list[tuple[str, str]]
              ) -> float | None:
    """The largest accuracy gap within a pair of ``pairs`` over the step points both reached."""
    gaps = [abs(x - y) for u, v in pairs if u in runs and v in runs for p in points
            for x, y in [(acc_at_step(runs[u], p), acc_at_step(runs[v], p))]
            if x is not None and y is not None]
    return max(gaps) if gaps else None


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def seconds_table(runs: dict[str, dict[str, Any]], points: list[float], budget: float) -> str:
    head = "| variant | " + " | ".join(f"{p:g} s" for p in points) + " | steps | s / step | load avg |"
    rows = [head, "|" + "---|" * (len(points) + 4)]
    for name, s in runs.items():
        cells = " | ".join(_f(acc_at_seconds(s, p, budget)) for p in points)
        rows.append(f"| {name} | {cells} | {s['steps']} | {s['step_s']:.3f} | {s['load_mean']:.1f} |")
    return "\n".join(rows)


def steps_table(runs: dict[str, dict[str, Any]], points: list[int]) -> str:
    head = "| variant | " + " | ".join(f"step {p}" for p in points) + " | best | DAPO drop ratio |"
    rows = [head, "|" + "---|" * (len(points) + 3)]
    for name, s in runs.items():
        cells = " | ".join(_f(acc_at_step(s, p)) for p in points)
        rows.append(f"| {name} | {cells} | {_f(s['best_acc'])} | {_f(s['drop_ratio'])} |")
    return "\n".join(rows)


# --------------------------------------------------------------------------- runs


def run_variant(name: str, a: argparse.Namespace, model: Path, data: Path, experiment: str,
                base: list[str]) -> dict[str, Any]:
    """One variant through the local launcher; its figures and the machine's load meanwhile."""
    from arealite.launcher.local import main as launch
    from arealite.observe.stats_logger import read_metrics
    from benchmarks.harness.grpo_runs import fresh_run_dir, log_tail

    out = fresh_run_dir(Path(a.fileroot), experiment, name)
    argv = [a.config, *base, f"trial_name={name}", *variant_overrides(name, a.max_new_tokens), *a.override]
    with LoadWatch(every=2.0) as watch:
        print(f"== {name} (load average {watch.samples[0]:.1f}): arealite train {' '.join(argv)}", flush=True)
        t0 = time.monotonic()
        if a.verbose:
            code = launch(argv)
        else:
            with open(out / "console.log", "w") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
                code = launch(argv)
    w = watch.summary()
    machine = {"load_start": watch.samples[0], "load_mean": w["mean"], "load_max": w["max"]}
    metrics = out / "logs" / "metrics.jsonl"
    if code != 0 or not metrics.is_file():
        tail = log_tail(str(out / "console.log"), 30) if (out / "console.log").is_file() else ""
        print(f"   {name} FAILED (exit {code}); last lines of {out / 'console.log'}:\n{tail}", flush=True)
        return {"failed": f"exit {code}", **machine}
    s = {**summarize(read_metrics(metrics)), **machine, "max_steps": a.max_steps}
    print(f"   done in {time.monotonic() - t0:.0f}s: {s['steps']} steps, accuracy "
          f"{_f(s['initial_acc'])} -> {_f(s['final_acc'])} (logs: {out / 'logs'})", flush=True)
    return s


def common_overrides(a: argparse.Namespace, model: Path, data: Path, experiment: str) -> list[str]:
    """What every variant shares: model, data, seed, budget, evaluation, batch shape."""
    out = [f"actor.path={model}", f"train_dataset.path={data / 'train.jsonl'}",
           f"valid_dataset.path={data / 'valid.jsonl'}", f"cluster.fileroot={a.fileroot}",
           f"experiment_name={experiment}", f"seed={a.seed}", f"servers.random_seed={a.seed}",
           f"total_train_seconds={a.seconds}", f"total_train_steps={a.max_steps}",
           f"evaluator.freq_steps={a.eval_every}", f"evaluator.max_prompts={a.eval_prompts or 'null'}",
           f"actor.ppo_n_minibatches={a.minibatches}", "stats_logger.tensorboard=false",
           "stats_logger.print_every=20", "saver.freq_steps=null"]
    if a.prompts:
        out += [f"train_dataset.batch_size={a.prompts}", f"rollout.consumer_batch_size={a.prompts}",
                f"rollout.max_concurrent_rollouts={2 * a.prompts}"]
    if a.samples:
        out += [f"gconfig.n_samples={a.samples}", f"actor.group_size={a.samples}"]
    return out


def plot(runs: dict[str, dict[str, Any]], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    try:
        for name, s in runs.items():
            left.plot([c[1] for c in s["curve"]], [c[2] for c in s["curve"]], marker=".", label=name)
            right.plot([c[0] for c in s["curve"]], [c[2] for c in s["curve"]], marker=".", label=name)
        left.set_xlabel("training seconds (evaluations excluded)")
        right.set_xlabel("trainer steps")
        left.set_ylabel("held-out greedy accuracy")
        for ax in (left, right):
            ax.grid(alpha=0.3)
        right.legend(fontsize=8)
        fig.savefig(png, dpi=100, bbox_inches="tight")
    finally:
        plt.close(fig)


def page_section(path: Path = RESULTS / "variants.json") -> str:
    """A saved run's tables for ``docs/benchmarks.md``."""
    r = json.loads(path.read_text())
    lines = [f"Command: `{r['command']}` (ran {r['date']}; machine: {r['machine']}). {r['about']}", "",
             "Variants (keys set on top of `configs/toy_grpo.yaml`, formulas in `docs/algorithms.md`):", ""]
    lines += [f"- `{n}`: {VARIANTS[n][0] if n in VARIANTS else ''}"
              + (f" (`{' '.join(o)}`)" if o else "") for n, o in r["overrides"].items()]
    if r["args"].get("override"):
        lines += ["", f"Then, for every variant (`--override`, last): `{' '.join(r['args']['override'])}`."]
    lines += ["", "Held-out greedy accuracy at fixed training seconds (noisy: see the load column "
              "and the note below):", "", r["seconds_table"], "",
              "Held-out greedy accuracy at fixed trainer steps (machine load does not bend these):",
              "", r["steps_table"], "", "\n\n".join(r["notes"])]
    return "\n".join(lines)


def report(a: argparse.Namespace, runs: dict[str, dict[str, Any]], meta: dict[str, Any], stem: str) -> int:
    """Print both tables and the notes; write the JSON (``meta``: when, where, how) and PNG."""
    ok = {n: s for n, s in runs.items() if "failed" not in s}
    failed = {n: s["failed"] for n, s in runs.items() if "failed" in s}
    step_pts = a.step_points or default_step_points(ok, a.eval_every)
    loads = [s["load_mean"] for s in runs.values()]
    about = (f"{a.seconds:g} training s per variant (or {a.max_steps} steps), seed {a.seed}, "
             + (f"with {' '.join(a.override)}, " if getattr(a, "override", None) else "") +
             f"{a.minibatches} PPO minibatch(es) per step, evaluation every {a.eval_every} steps on "
             f"{a.eval_prompts or 'all'} held-out prompts; mean 1-minute load average over the "
             f"runs {sum(loads) / len(loads):.1f} (max {max(s['load_max'] for s in runs.values()):.1f}) "
             f"on {os.cpu_count()} cores.")
    notes = [f"Failed: {', '.join(f'{n} ({why})' for n, why in failed.items())}." if failed else "",
             "Training seconds come from a machine shared with other work: a variant that ran while "
             "the load was higher did fewer steps in the same seconds. The step table compares the "
             "learning per update. With one PPO minibatch per step the ratio to the proximal policy "
             "is 1 when the loss is taken, so no clip binds: PPO, CISPO and clip-higher give the same "
             "gradient, GSPO is GRPO with the sequence-mean aggregation and DAPO is GRPO with dynamic "
             "sampling and the overlong penalty (`--minibatches 4` makes the clips matter)."]
    if ok:
        best = [s["best_acc"] for s in ok.values() if s["best_acc"] is not None]
        start = {s["initial_acc"] for s in ok.values()}
        notes.append(f"{len(ok)} of {len(runs)} variants ran to the end; held-out accuracy from "
                     f"{'/'.join(_f(x) for x in sorted(start, key=lambda x: x or 0))} at step 0 to a best of "
                     f"{_f(min(best, default=None))}-{_f(max(best, default=None))}.")
    pairs = [pr for pr in noise_pairs(a.minibatches) if pr[0] in ok and pr[1] in ok]
    gap = noise_gap(ok, step_pts, pairs)
    if gap is not None:
        last = step_pts[-1]
        order = sorted(ok, key=lambda n: -(acc_at_step(ok[n], last) or 0.0))
        n = getattr(a, "n_eval", None)
        se = f" the held-out set's own sampling error ({n} prompts) is +-{1.96 * (0.25 / n) ** 0.5:.2f} " \
             "at most (95 %);" if n else ""
        same = ", ".join(f"`{u}` and `{v}`" for u, v in pairs)
        notes.append(f"Run-to-run noise: {same} compute the same updates (asynchronous rollouts make "
                     f"the batches depend on timing even with the same seed) and differ by up to "
                     f"{gap:.2f} at the same step;{se} "
                     f"with one seed, a gap between two variants means something only when it is wider than "
                     f"these. At step {last}: "
                     + ", ".join(f"{n} {_f(acc_at_step(ok[n], last))}" for n in order) + ".")
    notes = [n for n in notes if n]
    st, sp = seconds_table(ok, a.points, a.seconds), steps_table(ok, step_pts)
    print(f"\n{about}\n\nheld-out accuracy at training seconds:\n\n{st}\n\n"
          f"held-out accuracy at steps:\n\n{sp}\n")
    for n in notes:
        print(n)
    out = Path(a.results_dir)
    out.mkdir(parents=True, exist_ok=True)
    args = {k: v for k, v in vars(a).items() if k not in ("argv", "report_only")}
    (out / f"{stem}.json").write_text(json.dumps(
        {**meta, "about": about, "args": args, "runs": runs, "seconds_table": st, "steps_table": sp,
         "notes": notes}, indent=1) + "\n")
    if ok:
        plot(ok, out / f"{stem}.png")
    print(f"\nwrote {out / f'{stem}.json'}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    tag = a.tag or ("quick" if a.quick else "")
    stem = "variants" + (f"_{tag}" if tag else "")
    if a.report_only:  # the runs' figures are in the JSON; the tables follow this code
        path = Path(a.results_dir) / f"{stem}.json"
        if not path.is_file():
            raise SystemExit(f"--report-only: no {path}")
        last = json.loads(path.read_text())
        for k in ("seconds", "eval_every", "eval_prompts", "max_steps", "minibatches", "seed", "n_eval",
                  "override"):
            setattr(a, k, last["args"].get(k))
        if "--points" not in a.argv:
            a.points = last["args"]["points"]
        meta = {k: last[k] for k in ("command", "date", "machine", "wall_s", "overrides")}
        return report(a, last["runs"], meta, stem)
    from arealite.api.config.loader import load_config
    from benchmarks.harness.report import machine_info, machine_line
    from benchmarks.harness.warm_start import ensure_model

    a.fileroot = str(Path(a.fileroot).resolve())
    if a.model_path:
        model, data = Path(a.model_path).resolve(), Path(a.data_dir).resolve()
    else:
        model, data = ensure_model(Path(a.fileroot))
        data = Path(a.data_dir).resolve() if a.data_dir else data
    cfg = load_config(a.config, [])
    a.max_new_tokens = cfg.gconfig.max_new_tokens
    n_train = sum(1 for line in (data / "train.jsonl").read_text().splitlines() if line.strip())
    prompts = a.prompts or cfg.train_dataset.batch_size
    a.max_steps = a.max_steps or cfg.total_train_epochs * (n_train // prompts)
    n_valid = sum(1 for line in (data / "valid.jsonl").read_text().splitlines() if line.strip())
    a.n_eval = min(a.eval_prompts or n_valid, n_valid)  # prompts per evaluation
    experiment = "bench-variants" + (f"-{tag}" if tag else "")
    base = common_overrides(a, model, data, experiment)
    t0 = time.monotonic()
    runs = {n: run_variant(n, a, model, data, experiment, base) for n in a.variants}
    meta = {"command": " ".join(["python -m benchmarks.studies.variants", *a.argv]).strip(),
            "date": time.strftime("%Y-%m-%d %H:%M"), "machine": machine_line(machine_info()),
            "wall_s": time.monotonic() - t0,
            "overrides": {n: variant_overrides(n, a.max_new_tokens) for n in a.variants}}
    return report(a, runs, meta, stem)


if __name__ == "__main__":
    sys.exit(main())
