"""Workflows against a live embedded server (``python -m servers.launch_server``) through the
real client (``RemoteInferenceEngine`` and its rollout executor)."""

from __future__ import annotations

import functools

import pytest
import torch

from arealite.api.config.rollout import GenerationHyperparameters, InferenceEngineConfig
from arealite.api.config.workflow import WorkflowConfig
from arealite.api.reward_api import RewardFailed, reward_stats
from arealite.api.workflow_factory import build_workflow
from tests.support import wf_reward_helpers as H
from tests.support.procs import embedded_server
from tests.support.wf_checks import assert_trajectory, recompute_logprobs
from workflows.multi_turn import MultiTurnWorkflow
from workflows.rewards.toy import toy_reward
from workflows.rlvr import RLVRWorkflow

pytestmark = pytest.mark.integration

SERVER_VERSION = 2
ROWS = [{"id": 10, "question": "What is 3 + 4?", "answer": "3 + 4 = 7\n#### 7"},
        {"id": 11, "question": "What is 9 - 5?", "answer": "9 - 5 = 4\n#### 4"}]


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from arealite.rollout.remote_engine import RemoteInferenceEngine

    args = ["--dtype", "float32", "--weight-version", str(SERVER_VERSION), "--log-level", "warning"]
    with embedded_server(str(tiny_model_dir), args) as addr:
        eng = RemoteInferenceEngine(InferenceEngineConfig(consumer_batch_size=2, request_timeout=120,
                                                       setup_timeout=60))
        eng.initialize(addr)
        eng.set_version(SERVER_VERSION)
        try:
            yield eng
        finally:
            eng.destroy()


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).eval()


def _g(n=2, max_new=8):
    return GenerationHyperparameters(n_samples=n, max_new_tokens=max_new, temperature=1.0)


def _episode(engine, wf, row, timeout=120):
    return engine.executor.run_coroutine(wf.arun_episode(engine, dict(row))).result(timeout)


def test_rlvr_batch_through_executor(engine, tiny_tokenizer, hf_model):
    wf = RLVRWorkflow(toy_reward, _g(), tiny_tokenizer)
    batch = engine.rollout_batch([dict(r) for r in ROWS], wf)
    assert_trajectory(batch, 4)
    assert sorted(batch["sample_ids"].tolist()) == [10, 10, 11, 11]
    gen = batch["loss_mask"]
    assert gen.any(1).all()
    assert set(batch["versions"][gen].tolist()) == {SERVER_VERSION}  # reported by the server
    # the server's logprobs are the model's (same weights, temperature 1)
    for b in range(4):
        n = int(batch["attention_mask"][b].sum())
        ref = recompute_logprobs(hf_model, batch["input_ids"][b], n)
        m = gen[b, :n]
        torch.testing.assert_close(batch["logprobs"][b, :n][m], ref[m], atol=2e-4, rtol=1e-3)


def test_multi_turn_against_server(engine, tiny_tokenizer):
    wf = MultiTurnWorkflow(toy_reward, _g(n=2, max_new=6), tiny_tokenizer, max_turns=3,
                           turn_discount=0.5)
    traj = _episode(engine, wf, ROWS[0])
    assert_trajectory(traj, 2)
    fb = torch.tensor(wf.feedback_after_eos)
    cut = torch.tensor(wf.feedback_after_cut)
    for b in range(2):
        n = int(traj["attention_mask"][b].sum())
        lm, ver, ids = traj["loss_mask"][b, :n], traj["versions"][b, :n], traj["input_ids"][b, :n]
        turns = int(traj["num_turns"][b])
        # every non-generated span after the prompt is exactly one of the two feedback sequences
        spans, t = [], int(lm.int().argmax())
        while t < n:
            while t < n and lm[t]:
                t += 1
            s = t
            while t < n and not lm[t]:
                t += 1
            if t > s:
                spans.append(ids[s:t])
        assert len(spans) == turns - 1
        for sp in spans:
            assert torch.equal(sp, fb) or torch.equal(sp, cut)
        assert (ver[~lm] == -1).all() and (ver[lm] == SERVER_VERSION).all()
        if turns > 1:  # never right (random weights): reward 0 whatever the discount
            assert traj["rewards"][b].item() in (0.0, 0.5 ** (turns - 1))


def test_failing_rewards_reject_the_episode_or_score_zero_and_are_counted(engine, tiny_tokenizer):
    before = reward_stats()
    with pytest.raises(RewardFailed):  # the default: nothing of this episode is trained
        _episode(engine, RLVRWorkflow(H.raising_reward, _g(max_new=3), tiny_tokenizer), ROWS[0])
    _episode(engine, RLVRWorkflow(H.const_reward, _g(max_new=2), tiny_tokenizer), ROWS[0])  # warm
    slow = RLVRWorkflow(functools.partial(H.sleeping_reward, seconds=60), _g(max_new=3),
                        tiny_tokenizer, reward_timeout=1.0, reward_failure="zero")
    traj = _episode(engine, slow, ROWS[1])
    assert traj["rewards"].tolist() == [0.0, 0.0]
    after = reward_stats()
    assert after["errors"] - before["errors"] == 2
    assert after["timeouts"] - before["timeouts"] == 2


def test_custom_workflow_by_import_path_end_to_end(engine, tiny_tokenizer):
    cfg = WorkflowConfig(path="tests.support.wf_custom_example:TargetLengthWorkflow",
                         kwargs={"target_len": 3})
    wf = build_workflow(cfg, _g(n=2, max_new=5), tiny_tokenizer)
    batch = engine.rollout_batch([dict(r) for r in ROWS], wf)
    assert_trajectory(batch, 4)
    assert (batch["rewards"] == -(batch["loss_mask"].sum(1) - 3).abs().float()).all()
