"""One GRPO step of the real-model job (``configs/smollm2_rg_grpo.yaml``) on the real
SmolLM2-135M-Instruct: reasoning-gym rows, the task's own verifier as the reward (in the reward
pool), rollouts on an embedded server, an FSDP2 update, weights broadcast to the server (which
then reports version 1 and serves them), and a checkpoint that transformers loads."""

from __future__ import annotations

import json
import sys

import pytest
import requests

from arealite.dataset.reasoning_gym import write_reasoning_gym
from arealite.demo.real_model_job import DEFAULT_SHOTS, LORA_OVERRIDES, default_tasks
from benchmarks.harness.grpo_runs import ROOT, wait_exit
from tests.support.procs import embedded_server, log_tail, spawn

pytestmark = [pytest.mark.slow, pytest.mark.integration]
pytest.importorskip("reasoning_gym")


@pytest.mark.long
@pytest.mark.timeout(900)  # a loaded 2-core machine: the server and the trainer each load 135M
def test_one_grpo_step_on_reasoning_gym_pushes_weights_and_checkpoints(tmp_path, smollm2_dir):
    import torch
    from transformers import AutoModelForCausalLM

    # the import saves dequantized weights and says so (transformers' Trainer refuses a model
    # whose config still carries the GGUF quantization_config)
    assert "quantization_config" not in json.loads((smollm2_dir / "config.json").read_text())
    data = tmp_path / "data"
    tasks = default_tasks()
    write_reasoning_gym(data, tasks, 8, 4, seed=0, system_prompt="direct", answer_prefix="<answer>",
                        shots=DEFAULT_SHOTS)
    with embedded_server(
        str(smollm2_dir),
        ["--context-length", "512", "--dtype", "float32", "--weight-version", "0"],
        timeout=300,
    ) as addr:
        before = requests.get(f"http://{addr}/model_info", timeout=10).json()
        assert str(before["weight_version"]) == "0"
        cmd = [
            sys.executable,
            "-m",
            "arealite.launcher.local",
            str(ROOT / "configs/smollm2_rg_grpo.yaml"),
            f"cluster.fileroot={tmp_path}",
            f"actor.path={smollm2_dir}",
            f"train_dataset.path={data / 'train.jsonl'}",
            f"valid_dataset.path={data / 'valid.jsonl'}",
            "evaluator.freq_steps=1",
            "evaluator.pass_k=2",
            "train_dataset.batch_size=2",
            "actor.group_size=2",
            "gconfig.n_samples=2",
            "gconfig.max_new_tokens=8",
            "rollout.consumer_batch_size=2",
            "rollout.max_concurrent_rollouts=2",
            "total_train_steps=1",
            "saver.freq_steps=1",
            "launcher.mode=trainer_only",
            f"rollout.server_addrs=[{addr}]",
        ]
        with spawn(cmd) as (proc, log):
            code = wait_exit(proc, log, 420)
            assert code == 0, f"the SmolLM2 GRPO step failed ({code}):\n{log_tail(log, 60)}"
        info = requests.get(f"http://{addr}/model_info", timeout=10).json()
        assert str(info["weight_version"]) == "1"  # the step's weights reached the server
        prompt = [1, 4093, 314, 216, 34, 1232, 216, 35, 47]  # token ids; any will do
        r = requests.post(
            f"http://{addr}/generate",
            timeout=120,
            json={
                "input_ids": prompt,
                "sampling_params": {"max_new_tokens": 4, "temperature": 0},
                "return_logprob": True,
            },
        )
        assert r.status_code == 200 and r.json()["meta_info"]["weight_version"] == "1"
        served = [(t, lp) for lp, t, _ in r.json()["meta_info"]["output_token_logprobs"]]

    run = tmp_path / "smollm2-rg-grpo" / "cpu"
    rows = [json.loads(line) for line in (run / "logs" / "metrics.jsonl").read_text().splitlines()]
    (step,) = [r for r in rows if r["step"] == 1]
    assert step["n_seqs"] == 4  # 2 prompts x 2 samples
    assert step["timeperf/weight_sync"] > 0 and step["rollout/version"] == 1
    # the task's verifier ran in the reward pool (not inline) and answered every sample
    assert step["reward_fn/ok"] >= 4 and step["reward_fn/inline"] == 0
    # Invariant 4 with a real model: the server's sampling logprobs are the trainer's.
    assert step["logprob_agreement/n_tokens"] > 0
    assert step["logprob_agreement/max_abs_diff"] < 1e-4  # measured ~2e-5 in fp32
    assert abs(step["approx_kl/avg"]) < 1e-4

    # The held-out evaluation's fields (#56), before training and after the step: right, exact,
    # format, the task's score, majority shares and collapse, pass@2 of sampled replies; and
    # every graded reply kept in the run folder.
    evals = [r for r in rows if "eval/right" in r]
    assert [r["step"] for r in evals] == [0, 1]
    for r in evals:
        shares = ("right", "exact", "format", "score", "majority_share", "gold_majority_share",
                  "pass@2", "pass@2_exact")
        assert all(0.0 <= r[f"eval/{k}"] <= 1.0 for k in shares), r
        assert r["eval/exact"] <= r["eval/right"] and r["eval/collapse"] in (0.0, 1.0)
        assert r["eval/n"] == 4 and r["eval/rows_written"] == 4 and r["eval/pass@2_rows"] == 4
        assert "eval/accuracy" not in r  # no eval_fn: the mean reward is eval/score, never this
    kept = [json.loads(line) for line in (run / "logs" / "heldout_completions.jsonl").read_text().splitlines()]
    assert len(kept) == 8 and {k["step"] for k in kept} == {0, 1}
    for k in kept:
        assert {"prompt", "reply", "gold", "right", "exact", "format", "score"} <= set(k)
        # the few-shot prompt: three solved problems (user turns, answered in tags), then the
        # question, with the answer tag open
        assert k["prompt"].count("<|im_start|>user") == DEFAULT_SHOTS + 1
        assert k["prompt"].count("</answer><|im_end|>") == DEFAULT_SHOTS
        assert k["prompt"].endswith("<|im_start|>assistant\n<answer>")
        assert k["exact"] == (k["score"] == 1.0)  # the job pays right answers only, in full

    # The step's checkpoint loads with transformers and is the model the server was serving:
    # its logprobs of the server's greedy tokens are the server's.
    model = AutoModelForCausalLM.from_pretrained(
        str(run / "checkpoints" / "step1"), dtype=torch.float32
    )
    ids = torch.tensor([prompt + [t for t, _ in served]])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, len(prompt) - 1 : -1].float(), dim=-1)
    ours = [logp[i, t].item() for i, (t, _) in enumerate(served)]
    assert max(abs(a - b) for a, (_, b) in zip(ours, served)) < 1e-4


def test_lora_overrides_make_a_valid_config():
    from arealite.api.config.loader import load_config

    cfg = load_config(str(ROOT / "configs/smollm2_rg_grpo.yaml"), LORA_OVERRIDES)
    assert cfg.actor.lora is not None and cfg.weight_update.type == "tensor"
