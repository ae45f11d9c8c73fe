"""A verifiers environment trains through arealite end to end, in a short form: ``arealite train``
on the shipped config of the tool-calling environment (configs/vf_toy_tools_grpo.yaml,
docs/environments.md), shortened by overrides only, on the taught tiny tool model and its
question (three model turns an episode: two ``calc`` calls over MCP, then the answer). One run
(a launch costs a server and a trainer start; the other environments' episodes go through the
same workflow and are checked token for token in test_verifiers_env.py). This checks the
mechanics, not learning (benchmarks/studies/vf_env_curves.py measures reward curves,
docs/environments.md has the figures): every step trains on the
rows the episodes made (the fields the trainer logs are there, no episode failed, every row a
finished turn), and the tokens trained on are the servers' own: the trainer's recomputed
log-probs of the tokens generated with the weights it held equal the servers' (the invariant
``logprob_agreement`` reports)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from arealite.observe.stats_logger import read_metrics
from tests.support.procs import log_tail, spawn

pytest.importorskip("verifiers.v1")

ROOT = Path(__file__).resolve().parents[3]
ENVS = str(ROOT / "examples" / "verifiers_envs")
STEPS = 2
SHORT = [f"total_train_steps={STEPS}", "train_dataset.batch_size=2",
         "rollout.consumer_batch_size=2", "rollout.max_concurrent_rollouts=2",
         "workflow.kwargs.n_episodes=2", "trial_name=e2e"]


def train(config: str, fileroot: Path, overrides: list[str]) -> list[dict]:
    cmd = [sys.executable, "-m", "arealite.cli.main", "train", config,
           f"cluster.fileroot={fileroot}", *SHORT, *overrides]
    with spawn(cmd) as (proc, log):  # the suite runs from the repository root
        t0 = time.monotonic()
        while proc.poll() is None and time.monotonic() - t0 < 800:
            time.sleep(1)
        assert proc.poll() == 0, f"training failed or timed out:\n{log_tail(log, 60)}"
    name = next(x.split(": ", 1)[1] for x in (ROOT / config).read_text().splitlines()
                if x.startswith("experiment_name: "))
    return [r for r in read_metrics(fileroot / name / "e2e" / "logs" / "metrics.jsonl")
            if r["step"] >= 1]


def check_steps(steps: list[dict]) -> None:
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    for r in steps:
        assert r["rollout/failed"] == 0 and r["update_successful"] == 1.0, r
        assert r["n_seqs"] >= 2 * 2 and 0.0 <= r["reward"] <= 1.0, r  # 2 tasks x 2 episodes
        assert r["gen_len"] > 0 and "task_reward/avg" in r and "staleness/max" in r
    # step 1 trains tokens of version 0 with version-0 weights: agreement is measured there
    agree = [r["logprob_agreement/max_abs_diff"] for r in steps if "logprob_agreement/n_tokens" in r]
    assert agree and max(agree) < 1e-3, agree
    assert steps[0]["rollout/trained_seqs"] >= 4


@pytest.mark.integration
@pytest.mark.long
@pytest.mark.timeout(900)  # a loaded 2-core machine: the server and the trainer start slowly
def test_tool_calling_environment_trains(tool_model_dir, tmp_path):
    from workflows.envs.verifiers_env import export_tasks

    rows = tmp_path / "toy_tools.jsonl"
    rows.write_text("".join(json.dumps({"id": i, "question": "What is 12*7+5?", "answer": "89"})
                            + "\n" for i in range(4)))
    env = {"taskset": {"id": "vf_toy_tools", "path": str(rows)}}
    export_tasks(env, tmp_path / "tasks.jsonl", env_paths=[ENVS])
    steps = train("configs/vf_toy_tools_grpo.yaml", tmp_path, [
        f"actor.path={tool_model_dir}", f"train_dataset.path={tmp_path / 'tasks.jsonl'}",
        f"workflow.kwargs.env.taskset.path={rows}",
        "gconfig.max_new_tokens=120"])  # the tiny tokenizer spells a call in ~60 tokens
    check_steps(steps)
    # the taught model calls the tool in its sampled episodes (temperature 1.0)
    assert any(r["gen_len"] > 40 for r in steps)
