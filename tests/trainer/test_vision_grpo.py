"""The vision job's two phases in a short form, over the launcher: an SFT warm start of the
untrained tiny Qwen2-VL on image rows, then GRPO from it (embedded server with the vision tower,
VisionRLVRWorkflow by import path, weights, vision tower included, broadcast every step).

Held-out accuracy rises in SFT from the untrained model's to the answer prior's, and the GRPO
servers' greedy evaluation of the warm start keeps it; at the first GRPO step the servers'
image-prompt logprobs equal the trainer's (invariant 4). The rise that needs the image (about
500 SFT steps of 64 rows, then GRPO) is the full run's, measured in docs/vision.md."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from arealite.utils.stats_logger import read_metrics
from tests.procs import log_tail, spawn

SFT_STEPS = 24
STEPS = 2


def _run(cmd: list[str], what: str, limit: float = 300) -> None:
    with spawn([sys.executable, "-m", "arealite.cli.main", *cmd]) as (proc, log):
        t0 = time.monotonic()
        while proc.poll() is None and time.monotonic() - t0 < limit:
            time.sleep(1)
        assert proc.poll() == 0, f"{what} failed or timed out:\n{log_tail(log, 60)}"


@pytest.mark.integration
def test_short_vision_sft_then_grpo(tmp_path: Path, tiny_vl_model_dir, toy_vision_dir):
    data = [f"train_dataset.path={toy_vision_dir / 'train.jsonl'}",
            f"valid_dataset.path={toy_vision_dir / 'valid.jsonl'}"]
    sft_model = tmp_path / "sft_model"
    _run(["train", "configs/toy_vision_sft.yaml", f"cluster.fileroot={tmp_path}",
          f"model.path={tiny_vl_model_dir}", *data, f"total_train_steps={SFT_STEPS}",
          f"evaluator.freq_steps={SFT_STEPS}", "train_dataset.batch_size=16",
          f"output_dir={sft_model}"], "vision SFT")
    sft = [r for r in read_metrics(tmp_path / "toy-vision-sft" / "main" / "logs" / "metrics.jsonl")
           if "valid/accuracy" in r]
    assert [r["step"] for r in sft] == [0, SFT_STEPS]
    # untrained: a random token, never the answer; after SFT at least the answer prior's share
    # ("0" is the answer of 14 of these 32 held-out scenes) less a margin
    assert sft[0]["valid/accuracy"] <= 0.1 and sft[-1]["valid/accuracy"] >= 0.25, sft

    _run(["train", "configs/toy_vision_grpo.yaml", f"cluster.fileroot={tmp_path}",
          f"actor.path={sft_model}", "trial_name=e2e", *data,
          f"total_train_steps={STEPS}", f"evaluator.freq_steps={STEPS}", "train_dataset.batch_size=4",
          "rollout.consumer_batch_size=4", "gconfig.n_samples=4", "actor.group_size=4"], "vision GRPO")
    rows = read_metrics(tmp_path / "toy-vision-grpo" / "e2e" / "logs" / "metrics.jsonl")
    steps = [r for r in rows if r["step"] >= 1]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    first = steps[0]
    assert first["logprob_agreement/n_tokens"] > 0
    assert first["logprob_agreement/max_abs_diff"] < 5e-5
    assert abs(first["approx_kl/avg"]) < 1e-6
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    # greedy generation on the server from the warm start: the SFT's accuracy carried over
    assert len(evals) == 2 and min(evals) >= 0.2, (sft, evals)
    print(f"vision short form: SFT held-out accuracy {sft[0]['valid/accuracy']:.3f} -> "
          f"{sft[-1]['valid/accuracy']:.3f}; GRPO greedy {evals[0]:.3f} -> {evals[-1]:.3f}")
