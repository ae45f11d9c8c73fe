import asyncio
import functools
import json
import time

import pytest
import torch

from arealite.api.config.rollout import GenerationHyperparameters
from arealite.api.reward_api import RewardFailed, reward_stats
from tests.support import wf_reward_helpers as H
from tests.support.wf_checks import assert_trajectory, recompute_logprobs
from tests.support.wf_local_engine import ScriptedEngine
from workflows.rewards.toy import toy_reward
from workflows.rlvr import RLVRWorkflow

ROW = {"id": 11, "question": "What is 3 + 4?", "answer": "3 + 4 = 7\n#### 7"}


def _wf(tok, reward=toy_reward, n=3, max_new=8, **kw):
    g = GenerationHyperparameters(n_samples=n, max_new_tokens=max_new, temperature=1.0)
    return RLVRWorkflow(reward, g, tok, **kw)


def test_group_trajectory_contract(local_engine, tiny_tokenizer):
    wf = _wf(tiny_tokenizer)
    traj = asyncio.run(wf.arun_episode(local_engine, dict(ROW)))
    prompt = tiny_tokenizer.apply_chat_template(
        [{"role": "user", "content": ROW["question"]}], tokenize=False, add_generation_prompt=True)
    p_ids = tiny_tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert_trajectory(traj, 3, [len(p_ids)] * 3)
    assert (traj["input_ids"][:, : len(p_ids)] == torch.tensor(p_ids)).all()
    assert traj["sample_ids"].dtype == torch.int64 and traj["sample_ids"].tolist() == [11] * 3
    assert set(traj["versions"][traj["loss_mask"]].tolist()) == {local_engine.version}
    # rids: one per sample, all distinct; the engine saw exactly the prompt
    reqs = local_engine.requests[-3:]
    assert len({r.rid for r in reqs}) == 3 and all(r.input_ids == p_ids for r in reqs)
    assert all(local_engine.model.config.eos_token_id in r.gconfig.stop_token_ids for r in reqs)
    # logprobs[b, t] is the behaviour logprob of input_ids[b, t]: recompute them with the model
    for b in range(3):
        n = int(traj["attention_mask"][b].sum())
        ref = recompute_logprobs(local_engine.model, traj["input_ids"][b], n)
        gen = traj["loss_mask"][b, :n]
        torch.testing.assert_close(traj["logprobs"][b, :n][gen], ref[gen], atol=1e-4, rtol=1e-4)


def test_correct_answer_scores_one(tiny_model_dir, tiny_tokenizer):
    right = tiny_tokenizer("3 + 4 = 7\n#### 7<|im_end|>", add_special_tokens=False)["input_ids"]
    wrong = tiny_tokenizer("3 + 4 = 8\n#### 8<|im_end|>", add_special_tokens=False)["input_ids"]
    eng = ScriptedEngine(str(tiny_model_dir), [right, wrong], version=5)
    traj = asyncio.run(_wf(tiny_tokenizer, n=2, max_new=32).arun_episode(eng, dict(ROW)))
    assert sorted(traj["rewards"].tolist()) == [0.0, 1.0]
    assert_trajectory(traj, 2)


@pytest.mark.integration  # reward worker processes
def test_raising_reward_rejects_the_episode_and_is_counted(local_engine, tiny_tokenizer,
                                                          reward_pool_session):
    before = reward_stats()
    with pytest.raises(RewardFailed):  # nothing of the episode is trained
        asyncio.run(_wf(tiny_tokenizer, H.raising_reward, n=2, max_new=4).arun_episode(local_engine, dict(ROW)))
    # the first failure ends the episode; the other sample's call may still be finishing
    assert reward_stats()["errors"] - before["errors"] >= 1
    zero = _wf(tiny_tokenizer, H.raising_reward, n=2, max_new=4, reward_failure="zero")
    traj = asyncio.run(zero.arun_episode(local_engine, dict(ROW)))
    assert traj["rewards"].tolist() == [0.0, 0.0]  # the old behaviour, when asked for


@pytest.mark.integration  # reward worker processes
def test_slow_reward_times_out_to_zero_and_is_counted(local_engine, tiny_tokenizer, reward_pool_session):
    # warm the pool so that worker start-up is not part of the measured time
    asyncio.run(_wf(tiny_tokenizer, H.const_reward, n=2, max_new=2).arun_episode(local_engine, dict(ROW)))
    slow = functools.partial(H.sleeping_reward, seconds=60)
    wf = _wf(tiny_tokenizer, slow, n=2, max_new=2, reward_timeout=1.0, reward_failure="zero")
    before = reward_stats()
    t0 = time.monotonic()
    traj = asyncio.run(wf.arun_episode(local_engine, dict(ROW)))
    assert time.monotonic() - t0 < 20
    assert traj["rewards"].tolist() == [0.0, 0.0]
    assert reward_stats()["timeouts"] - before["timeouts"] == 2


def test_row_formats(local_engine, tiny_tokenizer):
    wf = _wf(tiny_tokenizer, n=1, max_new=2)
    msgs = {"messages": [{"role": "user", "content": "What is 1 + 1?"}], "answer": "#### 2"}
    t1 = asyncio.run(wf.arun_episode(local_engine, msgs))
    assert "sample_ids" not in t1  # no integer id in the row
    ids = [5, 6, 7, 8]
    t2 = asyncio.run(wf.arun_episode(local_engine, {"input_ids": ids, "answer": "#### 2", "id": 1}))
    assert t2["input_ids"][0, :4].tolist() == ids and not t2["loss_mask"][0, :4].any()
    raw = _wf(tiny_tokenizer, n=1, max_new=2, apply_chat_template=False)
    t3 = asyncio.run(raw.arun_episode(local_engine, {"prompt": "What is 1 + 1?", "answer": "#### 2"}))
    p = tiny_tokenizer("What is 1 + 1?", add_special_tokens=False)["input_ids"]
    assert t3["input_ids"][0, : len(p)].tolist() == p
    with pytest.raises(ValueError, match="needs one of"):
        asyncio.run(wf.arun_episode(local_engine, {"answer": "#### 2"}))
    with pytest.raises(ValueError, match="input_ids"):
        asyncio.run(wf.arun_episode(local_engine, {"input_ids": [], "answer": "#### 2"}))


def test_dump_dir(local_engine, tiny_tokenizer, tmp_path):
    wf = _wf(tiny_tokenizer, n=2, max_new=3, dump_dir=str(tmp_path))
    asyncio.run(wf.arun_episode(local_engine, dict(ROW)))
    f = tmp_path / str(local_engine.version) / "11.jsonl"
    recs = [json.loads(line) for line in f.read_text().splitlines()]
    assert len(recs) == 2 and {"prompt", "completion", "reward"} <= set(recs[0])


def test_constructor_errors(tiny_tokenizer):
    g = GenerationHyperparameters()
    with pytest.raises(TypeError, match="module level"):
        RLVRWorkflow(lambda *a, **k: 0.0, g, tiny_tokenizer)
    with pytest.raises(TypeError, match="GenerationHyperparameters"):
        RLVRWorkflow(toy_reward, {"n_samples": 2}, tiny_tokenizer)
    with pytest.raises(ValueError, match="tokenizer"):
        RLVRWorkflow(toy_reward, g, None)
