"""One GRPO step on the real SmolLM2-135M-Instruct (``configs/smollm2_grpo.yaml``): rollouts on
an embedded server, an FSDP2 update, weights broadcast to the server, which then reports
version 1 and serves the trained weights."""

from __future__ import annotations

import json
import sys

import pytest
import requests

from arealite.demo.toy_math import write_toy_math
from benchmarks.harness.grpo_runs import ROOT, wait_exit
from tests.support.procs import embedded_server, log_tail, spawn

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_one_grpo_step_pushes_weights(tmp_path, smollm2_dir):
    data = tmp_path / "data"
    write_toy_math(data, n_train=8, n_valid=2, seed=0)
    with embedded_server(str(smollm2_dir), ["--context-length", "256", "--dtype", "float32", "--weight-version", "0"],
                         timeout=300) as addr:
        before = requests.get(f"http://{addr}/model_info", timeout=10).json()
        assert str(before["weight_version"]) == "0"
        cmd = [sys.executable, "-m", "arealite.launcher.local", str(ROOT / "configs/smollm2_grpo.yaml"),
               f"cluster.fileroot={tmp_path}", f"actor.path={smollm2_dir}",
               f"train_dataset.path={data / 'train.jsonl'}", "total_train_steps=1",
               "launcher.mode=trainer_only", f"rollout.server_addrs=[{addr}]"]
        with spawn(cmd) as (proc, log):
            code = wait_exit(proc, log, 240)
            assert code == 0, f"the SmolLM2 GRPO step failed ({code}):\n{log_tail(log, 60)}"
        info = requests.get(f"http://{addr}/model_info", timeout=10).json()
        assert str(info["weight_version"]) == "1"  # the step's weights reached the server
        r = requests.post(f"http://{addr}/generate", timeout=120, json={
            "text": "What is 2 + 3?", "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
        assert r.status_code == 200 and r.json()["meta_info"]["weight_version"] == "1"

    rows = [json.loads(line) for line in
            (tmp_path / "smollm2-grpo" / "cpu" / "logs" / "metrics.jsonl").read_text().splitlines()]
    (step,) = [r for r in rows if r["step"] == 1]
    assert step["n_seqs"] == 4  # 2 prompts x 2 samples
    assert step["timeperf/weight_sync"] > 0 and step["rollout/version"] == 1
    # Invariant 4 with a real model: the server's sampling logprobs are the trainer's.
    assert step["logprob_agreement/n_tokens"] > 0
    assert step["logprob_agreement/max_abs_diff"] < 1e-4  # measured ~2e-5 in fp32
    assert abs(step["approx_kl/avg"]) < 1e-4
