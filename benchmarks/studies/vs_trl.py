"""arealite against TRL's ``GRPOTrainer`` on the main job's task, one after the other in one run.

    python -m benchmarks.studies.vs_trl [--quick] [--seconds S] [--target ACC] [--systems trl,async,sync]
                                [--seeds 1,2,3] [--trl-threads 1] [--override KEY=VALUE ...]

Needs TRL's virtualenv: ``make setup-trl`` (``requirements/trl.txt``, pinned).

Common to every system: the main job's tiny Qwen2 model and SFT warm start (built as ``make
run`` builds them when missing, under ``{fileroot}/assets``), the toy arithmetic task's
training rows, grader (``workflows.rewards.toy.toy_reward``) and held-out set, evaluated greedily
with the same max new tokens every ``--eval-every`` optimizer steps; the issue's per-step shape
(``--prompts`` prompts x ``--samples`` samples, default 8 x 8; the main job runs 16 x 8), at
most 5 new tokens (``#### N`` and EOS fit; the main job allows 10), learning rate (2e-4,
cosine to 0.2x over two epochs), clip 0.2, no KL term, gradient clipping 1.0, AdamW without
weight decay, fp32 on the CPU, no checkpoints, the seed (``--seeds``: every system once per
seed). Each system trains for ``--seconds`` of training time (evaluations excluded):

- ``trl``: ``GRPOTrainer`` (``use_vllm=False``, generation in line) in the TRL virtualenv
  (``benchmarks/studies/trl_grpo.py``), one process with ``--trl-threads`` torch threads (default: the
  machine's cores), without gradient checkpointing (its default; nothing to save here).
  Otherwise TRL's defaults (advantages against the group mean scaled by the group's std,
  ``loss_type="dapo"``: token mean over the batch, one optimizer step per batch).
- ``async``: ``configs/toy_grpo.yaml`` through the local launcher (embedded server + trainer,
  the cores split between them, eta = 2); ``sync``: ``configs/toy_grpo_sync.yaml`` (eta = 0).
  Both with ``ALGORITHM`` (below): TRL's estimator (``adv_estimator=grpo``) and PPO's clip
  against the behaviour logprobs (``use_decoupled_loss=false, recompute_logprob=false``)
  instead of the main job's batch-normalised advantages and decoupled loss; weight pushes that
  pause generation in place (``rollout.pause_mode=in_place``) rather than abort it; and without
  the main job's recovery checkpoint every 10 steps (TRL saves nothing).

Figures per system: steps, seconds per step (training seconds / steps), the phase times,
held-out right (the share of right answers, `eval/right`) against training seconds, and the training seconds to the first evaluation at
or above ``--target``. Headlines: arealite async / TRL for seconds per step (target <= 0.7) and
for time to the target right share (target <= 0.5); with several seeds, each seed's ratios and the
ratios of the means over seeds (which carry the targets: the first crossing of a noisy held-out
curve moves by ~60% from seed to seed, on both sides). Each side is evaluated every
``--eval-every`` of its own steps, so the side with slower steps sees its crossing later; a time
ratio comes with its bound from the grid (TRL at its last evaluation below the target). With
several seeds, also the time to the target on the seeds' mean curves (no target on that line:
when the average run holds the target, where a first crossing also counts a run that touches it
once and falls back). Writes ``benchmarks/results/vs_trl/vs_trl[_TAG].json`` (dated when its
last arm finished) and a PNG of the mean-score curves.

A run longer than one sitting goes in parts: ``--max-arms N`` runs at most N arms (one system,
one seed) and exits 3 naming what is left; the same command with ``--resume`` reuses every arm
whose ``arm.json`` (written in its run folder when it finishes) was measured with the same
figures-affecting arguments, and runs the rest. The arms run one after the other in any case;
each arm keeps its date, commit and load average (at its start and end, and sampled every 30 s
while it ran: mean and max), and the results file lists them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.paths import ROOT, results_dir
from benchmarks.harness.run_context import LoadWatch
from benchmarks.studies.vs_trl_arms import load_arm, save_arm
from benchmarks.studies.vs_trl_figures import (
    MEASURE,
    arealite_summary,
    finish,
    headlines,
    plot,
    report_part,
    run_key,
    table,
    trl_summary,
)

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

RESULTS = results_dir("vs_trl")
CONFIGS = {"async": ROOT / "configs" / "toy_grpo.yaml", "sync": ROOT / "configs" / "toy_grpo_sync.yaml"}
# --job real: SmolLM2-135M-Instruct on the real-model job's reasoning-gym rows (docs/real_model.md);
# sync is the job's config with what makes the toy job's sync twin sync
REAL_CONFIG = ROOT / "configs" / "smollm2_rg_grpo.yaml"
REAL_SYNC = ["async_training=false", "rollout.max_head_offpolicyness=0"]
REAL_ASYNC = ["rollout.max_head_offpolicyness=2"]  # eta as the toy comparison's (vs_trl_figures.LABELS)
# TRL's schedule here (cosine to 0.2x), which the toy configs have and the real job's does not
REAL_SCHEDULE = ["actor.optimizer.lr_scheduler_type=cosine", "actor.optimizer.min_lr_ratio=0.2"]
SYSTEMS = ("trl", "async", "sync")


# arealite's algorithm choices for this comparison (both arealite runs; ``--override`` wins):
# TRL's estimator (group mean and std), and PPO's clip taken against the behaviour policy that
# sampled the tokens, not the decoupled loss's proximal policy. With one optimizer step per batch
# the proximal policy is the current one, so the decoupled clip never binds (ratio 1, as in TRL)
# and nothing bounds the first steps' overshoot; against the behaviour policy (up to eta versions
# old) the clip is a trust region over the last eta updates. Measured (8 x 8, 5 tokens, seeds 1
# and 2): first held-out mean score >= 0.70 at steps 80 and 100, against 200-250 with the main
# job's choices and 150-240 for TRL. ``docs/benchmarks.md`` has the runs.
ALGORITHM = ["actor.adv_estimator=grpo", "actor.use_decoupled_loss=false", "actor.recompute_logprob=false"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="60 s per system, target 0.5")
    p.add_argument("--seconds", type=float, default=None, help="training seconds per system (default 300)")
    p.add_argument("--trl-seconds", type=float, default=None,
                   help="TRL's training seconds (default --seconds): a slower system needs a longer "
                        "budget to reach the target at all; time to target is compared, not the end")
    p.add_argument("--target", type=float, default=None, help="held-out right-share target (default 0.7; 0.5 with --quick)")
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, from {SYSTEMS}")
    p.add_argument("--prompts", type=int, default=8, help="prompts per step")
    p.add_argument("--samples", type=int, default=8, help="samples per prompt")
    p.add_argument("--max-new-tokens", type=int, default=5)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--eval-every", type=int, default=10, help="optimizer steps between evaluations")
    p.add_argument("--eval-prompts", type=int, default=0, help="0: the whole held-out set")
    p.add_argument("--trl-python", default=str(ROOT / ".venv-trl" / "bin" / "python"))
    p.add_argument("--trl-threads", default=",".join(sorted({"1", str(os.cpu_count() or 1)})),
                   help="torch threads of TRL's process; a comma list runs TRL once per count and "
                        "compares arealite with the best (on a loaded machine one thread can win)")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override for both arealite runs (repeatable)")
    p.add_argument("--seeds", default="1", help="comma-separated seeds (data order, sampling); "
                   "several run every system once per seed and the headlines are means over them")
    p.add_argument("--fileroot", default=str(ROOT / "outputs"))
    p.add_argument("--tag", default=None, help="results file suffix (default: quick or none)")
    p.add_argument("--resume", action="store_true",
                   help="reuse the arms a previous part of this run finished (same arguments)")
    p.add_argument("--max-arms", type=int, default=None,
                   help="run at most this many arms now; exit 3 naming the rest (rerun with --resume); "
                        "0 with --resume: report the finished arms")
    p.add_argument("--job", default="toy", choices=("toy", "real"),
                   help="toy: the main job's tiny model and task; real: SmolLM2 on the real-model "
                        "job's reasoning-gym rows, its config, grader and held-out set")
    a = p.parse_args(argv)
    a.seconds = a.seconds if a.seconds is not None else (60.0 if a.quick else 300.0)
    a.trl_seconds = a.trl_seconds if a.trl_seconds is not None else a.seconds
    a.target = a.target if a.target is not None else (0.5 if a.quick else 0.7)
    a.systems = [s.strip() for s in a.systems.split(",") if s.strip()]
    try:
        a.trl_threads = sorted({int(t) for t in str(a.trl_threads).split(",") if t.strip()})
    except ValueError:
        p.error(f"--trl-threads: comma-separated integers, not {a.trl_threads!r}")
    if not a.trl_threads or min(a.trl_threads) < 1:
        p.error("--trl-threads: at least one count, each >= 1")
    try:
        a.seeds = sorted({int(s) for s in str(a.seeds).split(",") if s.strip()})
    except ValueError:
        p.error(f"--seeds: comma-separated integers, not {a.seeds!r}")
    if not a.seeds:
        p.error("--seeds: at least one seed")
    bad = [s for s in a.systems if s not in SYSTEMS]
    if bad or not a.systems:
        p.error(f"--systems: unknown {bad or 'empty list'}; choose from {', '.join(SYSTEMS)}")
    if a.max_arms is not None and a.max_arms < 0:
        p.error("--max-arms: 0 (report the finished arms only) or more")
    if min(a.seconds, a.trl_seconds) <= 0 or not 0 < a.target <= 1 or min(a.prompts, a.samples, a.max_new_tokens, a.eval_every) < 1:
        p.error("--seconds > 0, 0 < --target <= 1, and --prompts/--samples/--max-new-tokens/--eval-every >= 1")
    return a


# --------------------------------------------------------------------------- runs


def arealite_argv(name: str, a: argparse.Namespace, model: Path, data: Path, experiment: str,
                  max_steps: int, seed: int, trial: str | None = None) -> list[str]:
    """The launcher's arguments for arealite system ``name`` (config ``CONFIGS[name]``): the
    common shape, the seed, and ``--override``s last (they win)."""
    config, extra = ((REAL_CONFIG, REAL_SCHEDULE + (REAL_SYNC if name == "sync" else REAL_ASYNC))
                     if a.job == "real" else (CONFIGS[name], []))
    return [str(config), *extra, f"actor.path={model}", f"train_dataset.path={data / 'train.jsonl'}",
            f"valid_dataset.path={data / 'valid.jsonl'}", f"cluster.fileroot={a.fileroot}",
            f"experiment_name={experiment}", f"trial_name={trial or name}", f"total_train_seconds={a.seconds}",
            f"total_train_steps={max_steps}",  # the lr schedule's length, as TRL's max_steps
            f"evaluator.freq_steps={a.eval_every}", f"evaluator.max_prompts={a.eval_prompts or 'null'}",
            f"train_dataset.batch_size={a.prompts}", f"rollout.consumer_batch_size={a.prompts}",
            f"rollout.max_concurrent_rollouts={2 * a.prompts}", f"gconfig.n_samples={a.samples}",
            f"actor.group_size={a.samples}", f"gconfig.max_new_tokens={a.max_new_tokens}",
            f"actor.optimizer.lr={a.lr}", f"seed={seed}", f"servers.random_seed={seed}",
            # TRL saves nothing (save_strategy="no"); the main job's recovery checkpoint every
            # 10 steps (weights + optimizer) would run on arealite's training clock
            "recover.freq_steps=null", "stats_logger.tensorboard=false",
            # a weight push pauses generation in place (requests wait in the batch and go on
            # under the new weights, each token keeping its version) instead of aborting and
            # re-prefilling them: the clip reads each token's own behaviour logprob either way
            "rollout.pause_mode=in_place", *ALGORITHM, *a.override]


def run_arealite(name: str, a: argparse.Namespace, model: Path, data: Path, experiment: str,
                 max_steps: int, seed: int) -> dict[str, Any]:
    from arealite.launcher.local import main as launch

    trial = run_key(name, seed, a.seeds)
    out = Path(a.fileroot) / experiment / trial
    shutil.rmtree(out, ignore_errors=True)  # metrics.jsonl is appended to: start clean
    out.mkdir(parents=True)
    argv = arealite_argv(name, a, model, data, experiment, max_steps, seed, trial)
    print(f"== arealite {name} (load average {os.getloadavg()[0]:.1f}): arealite train {' '.join(argv)}", flush=True)
    t0 = time.monotonic()
    with open(out / "console.log", "w") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        code = launch(argv)
    if code != 0:
        raise SystemExit(f"arealite {trial} failed (exit {code}); see {out / 'console.log'}")
    print(f"   done in {time.monotonic() - t0:.0f}s (logs: {out / 'logs'})", flush=True)
    records = [json.loads(line) for line in (out / "logs" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return arealite_summary(records, a.target)


def run_trl(a: argparse.Namespace, model: Path, data: Path, experiment: str, max_steps: int,
            threads: int, seed: int) -> dict[str, Any]:
    out = Path(a.fileroot) / experiment / run_key(f"trl-{threads}t", seed, a.seeds)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cmd = [a.trl_python, str(ROOT / "benchmarks" / "studies" / "trl_grpo.py"), "--model", str(model), "--data", str(data),
           "--out", str(out / "result.json"), "--seconds", str(a.trl_seconds), "--prompts", str(a.prompts),
           "--samples", str(a.samples), "--max-new-tokens", str(a.max_new_tokens), "--lr", str(a.lr),
           "--max-steps", str(max_steps), "--eval-every", str(a.eval_every),
           "--eval-prompts", str(a.eval_prompts), "--threads", str(threads), "--seed", str(seed),
           "--task", "rg" if a.job == "real" else "toy"]
    print(f"== TRL (load average {os.getloadavg()[0]:.1f}): {' '.join(cmd)}", flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": ""}
    t0 = time.monotonic()
    with open(out / "console.log", "w") as f:
        code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=ROOT).returncode
    if code != 0:
        tail = (out / "console.log").read_text().splitlines()[-20:]
        raise SystemExit(f"TRL run failed (exit {code}); last lines of {out / 'console.log'}:\n" + "\n".join(tail))
    print(f"   done in {time.monotonic() - t0:.0f}s (log: {out / 'console.log'})", flush=True)
    return trl_summary(json.loads((out / "result.json").read_text()), a.target)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if "trl" in a.systems and not Path(a.trl_python).is_file():
        print(f"vs_trl: no TRL virtualenv at {a.trl_python}: run `make setup-trl` first", file=sys.stderr)
        return 2
    from benchmarks.harness.warm_start import ensure_model, ensure_real_model

    model, data = (ensure_real_model if a.job == "real" else ensure_model)(Path(a.fileroot))
    n_train = sum(1 for line in (data / "train.jsonl").read_text().splitlines() if line.strip())
    from arealite.api.config.loader import load_config

    base = REAL_CONFIG if a.job == "real" else CONFIGS["async"]
    max_steps = load_config(str(base), []).total_train_epochs * (n_train // a.prompts)
    tag = a.tag or ("quick" if a.quick else "")
    experiment = "bench-vs-trl" + ("-real" if a.job == "real" else "") + (f"-{tag}" if tag else "")
    arms = [(seed, name, th) for seed in a.seeds  # a seed's systems side by side, then the next seed
            for name in a.systems for th in (a.trl_threads if name == "trl" else [None])]
    keys = [run_key(f"trl-{th}t" if th else name, seed, a.seeds) for seed, name, th in arms]
    runs: dict[str, dict[str, Any]] = {}
    arm_records: dict[str, dict[str, Any]] = {}
    ran = 0
    for (seed, name, th), key in zip(arms, keys):
        folder = Path(a.fileroot) / experiment / key
        kept = load_arm(folder, a) if a.resume else None
        if kept is not None:
            print(f"== {key}: kept from {kept['date']} (commit {kept['commit']}, load {kept['load_average']}"
                  f"{', during ' + str(kept['load_during']) if 'load_during' in kept else ''})", flush=True)
        elif a.max_arms is not None and ran >= a.max_arms:
            left = [k for k in keys[keys.index(key):] if load_arm(Path(a.fileroot) / experiment / k, a) is None]
            report_part(runs, keys, left, a.target)
            print(f"vs_trl: stopped after {ran} arm(s); left: {', '.join(left)}; "
                  "run the same command with --resume to go on", file=sys.stderr)
            return 3
        else:
            load = os.getloadavg()[0]
            with LoadWatch() as watch:
                summary = (run_trl(a, model, data, experiment, max_steps, th, seed) if th
                           else run_arealite(name, a, model, data, experiment, max_steps, seed))
            save_arm(folder, a, summary, load, watch.summary())
            kept, ran = load_arm(folder, a), ran + 1
        runs[key] = finish(kept["summary"], a.target)
        arm_records[key] = {k: kept[k] for k in ("date", "commit", "load_average", "load_during")
                            if k in kept}
    print(f"\n{a.prompts} prompts x {a.samples} samples per step, max {a.max_new_tokens} new tokens, lr {a.lr}, "
          f"{a.seconds:.0f} training seconds each (TRL {a.trl_seconds:.0f}); TRL torch threads {a.trl_threads}; seeds {a.seeds}\n")
    print(table(runs, a.target))
    print()
    for line in headlines(runs, a.target):
        print(line)
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = "vs_trl" + ("_real" if a.job == "real" else "") + (f"_{tag}" if tag else "")
    command = " ".join(["python -m benchmarks.studies.vs_trl", *(sys.argv[1:] if argv is None else argv)])
    (RESULTS / f"{stem}.json").write_text(json.dumps(
        # dated when its last arm finished (a run in parts reports long after its first arms)
        {"command": command.strip(), "date": max(r["date"] for r in arm_records.values()), "args": vars(a),
         "measure": MEASURE, "runs": runs,
         "arms": arm_records,
         "table": table(runs, a.target), "headlines": headlines(runs, a.target)}, indent=1))
    plot(runs, a.target, RESULTS / f"{stem}.png")
    print(f"\nwrote {RESULTS / f'{stem}.json'} and {RESULTS / f'{stem}.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
