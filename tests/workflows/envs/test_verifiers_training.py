"""The single-turn verifiers example trains in a short form: ``arealite train
configs/vf_toy_math_grpo.yaml`` (docs/environments.md), only overrides shorten it, from the toy
SFT warm start; no episode fails and the sampled reward rises."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from arealite.observe.stats_logger import read_metrics
from tests.support.procs import log_tail, spawn

pytest.importorskip("verifiers.v1")

ROOT = Path(__file__).resolve().parents[3]
STEPS = 12


@pytest.mark.integration
@pytest.mark.long
def test_vf_toy_math_trains(toy_assets, tmp_path):
    from workflows.envs.verifiers_env import export_tasks

    env = {"taskset": {"id": "vf_toy_math", "path": str(toy_assets / "toy_math" / "train.jsonl")}}
    export_tasks(env, tmp_path / "tasks.jsonl", env_paths=[str(ROOT / "examples" / "verifiers_envs")])
    cmd = [sys.executable, "-m", "arealite.cli.main", "train", "configs/vf_toy_math_grpo.yaml",
           f"cluster.fileroot={tmp_path}", f"actor.path={toy_assets / 'sft_model'}",
           f"train_dataset.path={tmp_path / 'tasks.jsonl'}",
           f"workflow.kwargs.env.taskset.path={toy_assets / 'toy_math' / 'train.jsonl'}",
           f"total_train_steps={STEPS}", "trial_name=e2e"]
    with spawn(cmd) as (proc, log):  # the suite runs from the repository root
        t0 = time.monotonic()
        while proc.poll() is None and time.monotonic() - t0 < 1200:
            time.sleep(1)
        assert proc.poll() == 0, f"training failed or timed out:\n{log_tail(log, 60)}"
    steps = [r for r in read_metrics(tmp_path / "vf-toy-math-grpo" / "e2e" / "logs" / "metrics.jsonl")
             if r["step"] >= 1]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    assert all(r["rollout/failed"] == 0 for r in steps)
    third = STEPS // 3
    early = sum(r["reward"] for r in steps[:third]) / third
    late = sum(r["reward"] for r in steps[-third:]) / third
    print(f"vf_toy_math: mean sampled reward, steps 1-{third}: {early:.3f}, last {third}: {late:.3f}")
    assert late > early + 0.05, (early, late, [round(r["reward"], 3) for r in steps])
