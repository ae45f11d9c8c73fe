import asyncio

import pytest

pytest.importorskip("reasoning_gym")

from arealite.api.reward_api import RewardFailed, is_inline, reward_stats  # noqa: E402
from arealite.dataset.reasoning_gym import TaskSpec, build_rows  # noqa: E402
from workflows.reward_pool import compute_reward  # noqa: E402
from workflows.rewards.reasoning_gym import extract, reasoning_gym_reward  # noqa: E402


def _kw(row):
    return {k: v for k, v in row.items() if k != "messages"}


def test_the_tasks_own_verifier_scores_tagged_answers():
    rows = build_rows(
        [TaskSpec("chain_sum"), TaskSpec("spell_backward")], 20, seed=1, split="valid"
    )
    assert not is_inline(reasoning_gym_reward)  # a verifier may hang: it runs in the pool
    for r in rows:
        assert reasoning_gym_reward("", f"so <answer>{r['answer']}</answer>", **_kw(r)) == 1.0
        assert reasoning_gym_reward("", "<answer>qqqq</answer>", **_kw(r)) < 0.5
        assert reasoning_gym_reward("", r["answer"], **_kw(r)) == 0.0  # no tag: not answered
        assert reasoning_gym_reward("", f" {r['answer']} ", untagged="whole", **_kw(r)) == 1.0


def test_extract_and_bad_rows():
    assert extract("a <answer>1</answer> b <answer> 2 </answer>") == "2"  # the last tag
    assert extract("no tag") is None and extract("no tag", "whole") == "no tag"
    with pytest.raises(ValueError, match="untagged"):
        extract("x", "sometimes")
    with pytest.raises(ValueError, match="task"):
        reasoning_gym_reward("", "<answer>1</answer>", answer="1")


@pytest.mark.integration  # a reward-pool worker process
def test_a_raising_verifier_rejects_the_episode_and_is_counted():
    (row,) = build_rows([TaskSpec("leg_counting")], 1, seed=0, split="valid")
    row = _kw(row)
    ok = asyncio.run(
        compute_reward(
            reasoning_gym_reward, "", f"<answer>{row['answer']}</answer>", [], [], row, timeout=60
        )
    )
    assert ok == 1.0
    before = reward_stats()["errors"]
    broken = {**row, "task": "basic_arithmetic", "answer": None}  # the verifier raises on it
    with pytest.raises(RewardFailed):
        asyncio.run(
            compute_reward(
                reasoning_gym_reward, "", "<answer>3</answer>", [], [], broken, timeout=60
            )
        )
    assert reward_stats()["errors"] == before + 1


def test_a_prefilled_reply_is_scored_from_the_prefix_on():
    (row,) = build_rows([TaskSpec("chain_sum")], 1, seed=2, split="valid", answer_prefix="<answer>")
    assert row["messages"][-1] == {"role": "assistant", "content": "<answer>"}
    gold = row["answer"]
    assert reasoning_gym_reward("", f"{gold}</answer>", **row) == 1.0
    assert reasoning_gym_reward("", f" {gold}", **row) == 0.0  # unclosed: no answer...
    assert reasoning_gym_reward("", f" {gold}", untagged="whole", **row) == 1.0  # ...unless whole
    partial = reasoning_gym_reward("", f"1 + 1 = {gold}", untagged="whole", **row)
    assert 0.0 < partial < 1.0  # the task's own partial credit


def test_full_credit_only_pays_a_right_answer_and_nothing_for_a_near_one():
    (row,) = build_rows([TaskSpec("chain_sum")], 1, seed=2, split="valid", answer_prefix="<answer>")
    gold = row["answer"]
    near = f"1 + 1 = {gold}"  # the task gives this partial credit (above)
    assert 0.0 < reasoning_gym_reward("", near, untagged="whole", **row) < 1.0
    assert reasoning_gym_reward("", near, untagged="whole", full_credit_only=True, **row) == 0.0
    assert reasoning_gym_reward("", f"{gold}</answer>", full_credit_only=True, **row) == 1.0
