"""Reward curves of the verifiers example environments trained through arealite on the toy model.

    python -m benchmarks.studies.vf_env_curves ENV [ENV ...] [--steps N] [--tasks T]
        [--episodes E] [--fileroot DIR] [KEY=VALUE ...]

ENV is ``single`` (examples/verifiers_envs/vf_toy_math.py, configs/vf_toy_math_grpo.yaml),
``multi`` (vf_toy_math_dialog.py, configs/vf_toy_math_dialog_grpo.yaml) or ``tools``
(vf_toy_tools.py, configs/vf_toy_tools_grpo.yaml). Each runs ``arealite train`` on its shipped
config, shortened by overrides only (``--steps`` steps of ``--tasks`` tasks x ``--episodes``
episodes; trailing ``KEY=VALUE`` go to every run), from the SFT warm start of the same toy task:
the main job's (``single``, ``multi``: ``{fileroot}/assets``, built as ``make run`` builds it) or
the agent job's (``tools``: ``{fileroot}/agent_assets``, its SFT stopped at a teacher-forced
held-out accuracy of 0.8 per turn, as tests/demo/test_agent_job.py does), reused when present.

Prints, per environment, the mean sampled reward (temperature 1.0) of every step, then the mean
of the first and the last third of the steps, rows (groups of episodes) that failed, and the largest gap between
the servers' and the trainer's log-probs of the trained tokens (the token-exact check). The
reward is ``correct`` of each environment: right answers for ``single`` and ``tools`` (a
sampled accuracy), partial credit over two questions for ``multi``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from arealite.observe.stats_logger import read_metrics
from benchmarks.harness.paths import ROOT

ENVS = {  # name -> (config, taskset id, assets folder, data file under it)
    "single": ("configs/vf_toy_math_grpo.yaml", "vf_toy_math", "assets", "toy_math/train.jsonl"),
    "multi": ("configs/vf_toy_math_dialog_grpo.yaml", "vf_toy_math_dialog", "assets",
              "toy_math/train.jsonl"),
    "tools": ("configs/vf_toy_tools_grpo.yaml", "vf_toy_tools", "agent_assets",
              "toy_tools/train.jsonl"),
}


def ensure_assets(fileroot: Path, folder: str) -> Path:
    from arealite.demo import agent_job, main_job

    assets = fileroot / folder
    if folder == "assets":
        main_job.build_assets(assets)
        code = main_job.ensure_sft_model(assets, fileroot)
    else:
        agent_job.build_assets(assets)
        code = main_job.ensure_sft(assets / "sft_model", [
            agent_job.SFT_CONFIG, *agent_job.asset_overrides(assets, "model.path"),
            f"cluster.fileroot={fileroot}", "stop_at_valid_accuracy=0.8",
            "evaluator.freq_steps=10"])
    if code != 0:
        raise SystemExit(f"building the SFT warm start in {assets} failed ({code})")
    return assets


def train(env: str, fileroot: Path, steps: int, tasks: int, episodes: int,
          extra: list[str]) -> list[dict]:
    from workflows.envs.verifiers_env import export_tasks

    config, taskset, folder, data = ENVS[env]
    assets = ensure_assets(fileroot, folder)
    rows = fileroot / "vf" / f"{taskset}_train.jsonl"
    spec = {"taskset": {"id": taskset, "path": str(assets / data)}}
    export_tasks(spec, rows, env_paths=[str(ROOT / "examples" / "verifiers_envs")])
    trial = f"curve-s{steps}-t{tasks}-e{episodes}"
    cmd = [sys.executable, "-m", "arealite.cli.main", "train", config,
           f"cluster.fileroot={fileroot}", f"trial_name={trial}", "launcher.overwrite=true",
           f"actor.path={assets / 'sft_model'}", f"train_dataset.path={rows}",
           f"workflow.kwargs.env.taskset.path={assets / data}", f"total_train_steps={steps}",
           f"train_dataset.batch_size={tasks}", f"rollout.consumer_batch_size={tasks}",
           f"rollout.max_concurrent_rollouts={tasks}", f"workflow.kwargs.n_episodes={episodes}",
           *extra]
    t0 = time.monotonic()
    code = subprocess.run(cmd, cwd=ROOT).returncode
    print(f"{env}: arealite train exited {code} after {time.monotonic() - t0:.0f} s", flush=True)
    name = next(x.split(": ", 1)[1] for x in (ROOT / config).read_text().splitlines()
                if x.startswith("experiment_name: "))
    path = fileroot / name / trial / "logs" / "metrics.jsonl"
    return [r for r in read_metrics(path) if r["step"] >= 1] if path.is_file() else []


def report(env: str, steps: list[dict]) -> None:
    if not steps:
        print(f"{env}: no step finished")
        return
    print(f"{env}: step  reward  elapsed_s")
    for r in steps:
        print(f"{env}: {r['step']:4d}  {r['reward']:.3f}  {r.get('elapsed_s', float('nan')):8.0f}")
    third = max(1, len(steps) // 3)
    early = sum(r["reward"] for r in steps[:third]) / third
    late = sum(r["reward"] for r in steps[-third:]) / third
    failed = max(r.get("rollout/failed", 0) for r in steps)  # the executor's running count
    agree = [r["logprob_agreement/max_abs_diff"] for r in steps
             if "logprob_agreement/max_abs_diff" in r]
    print(f"{env}: mean reward, steps 1-{third}: {early:.3f}; last {third}: {late:.3f} "
          f"(change {late - early:+.3f}); rows failed {failed:.0f}; "
          f"max |server - trainer| logprob {max(agree) if agree else float('nan'):.2e}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.studies.vf_env_curves")
    p.add_argument("envs", nargs="+", choices=sorted(ENVS))
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--tasks", type=int, default=4, help="tasks a step")
    p.add_argument("--episodes", type=int, default=8, help="episodes a task (the GRPO group)")
    p.add_argument("--fileroot", type=Path, default=ROOT / "outputs")
    args, extra = p.parse_known_args(argv)
    if any("=" not in x for x in extra):
        p.error(f"unknown arguments {[x for x in extra if '=' not in x]} (overrides are KEY=VALUE)")
    results = {env: train(env, args.fileroot.resolve(), args.steps, args.tasks, args.episodes, extra)
               for env in args.envs}
    for env, steps in results.items():
        report(env, steps)
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
