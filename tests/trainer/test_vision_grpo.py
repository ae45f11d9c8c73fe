"""A short GRPO run of the tiny Qwen2-VL over the launcher: embedded server with the vision
tower, VisionRLVRWorkflow by import path, weights (vision tower included) broadcast every step,
and at the first step the servers' image-prompt logprobs equal the trainer's (invariant 4)."""

from __future__ import annotations

import json
import sys
import time

import pytest

from tests.procs import log_tail, spawn

STEPS = 2


@pytest.mark.integration
def test_short_vision_grpo(tmp_path, tiny_vl_model_dir, toy_vision_dir):
    cmd = [
        sys.executable, "-m", "arealite.cli.main", "train", "configs/toy_vision_grpo.yaml",
        f"cluster.fileroot={tmp_path}", f"actor.path={tiny_vl_model_dir}", "trial_name=e2e",
        f"train_dataset.path={toy_vision_dir / 'train.jsonl'}",
        f"valid_dataset.path={toy_vision_dir / 'valid.jsonl'}",
        f"total_train_steps={STEPS}", f"evaluator.freq_steps={STEPS}", "train_dataset.batch_size=4",
        "rollout.consumer_batch_size=4", "gconfig.n_samples=4", "actor.group_size=4",
    ]
    with spawn(cmd) as (proc, log):
        t0 = time.monotonic()
        while proc.poll() is None and time.monotonic() - t0 < 300:
            time.sleep(1)
        assert proc.poll() == 0, f"vision GRPO failed or timed out:\n{log_tail(log, 60)}"
    rows = [json.loads(x) for x in (tmp_path / "toy-vision-grpo" / "e2e" / "logs" /
                                    "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in rows if r["step"] >= 1]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    first = steps[0]
    assert first["logprob_agreement/n_tokens"] > 0
    assert first["logprob_agreement/max_abs_diff"] < 5e-5
    assert abs(first["approx_kl/avg"]) < 1e-6
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    assert len(evals) == 2 and all(0.0 <= a <= 1.0 for a in evals)
