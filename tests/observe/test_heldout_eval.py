"""The default held-out evaluation end to end over a scripted policy (the engine is the only
stand-in: the tiny model's tokenizer, the real rewards and the real rows): a policy answering
one constant sets off the collapse warning and metric; right answers in the wrong format count
as right, not exact; pass@k from sampled replies; the rows are kept as JSONL."""

from __future__ import annotations

import json
import logging

import pytest

from arealite.api.config.run import EvaluatorConfig
from arealite.api.trajectory import pad_sequences_to_tensors
from arealite.demo.toy_math import format_problem
from arealite.observe.heldout_eval import COMPLETIONS_FILE, evaluate
from workflows.rewards.toy import toy_reward


class ScriptedPolicy:
    """``rollout_batch`` of an engine whose replies are ``reply(row, i)`` for the i-th sample
    (``n`` a row), scored by the workflow's reward like RLVRWorkflow scores them."""

    def __init__(self, tokenizer, reply, n: int = 1) -> None:
        self.tok, self.reply, self.n = tokenizer, reply, n

    def rollout_batch(self, rows, workflow):
        seqs = []
        for row in rows:
            prompt = self.tok.encode(row["question"], add_special_tokens=False)
            for i in range(getattr(workflow, "n", 1)):
                text = self.reply(row, i)
                out = self.tok.encode(text, add_special_tokens=False)
                seqs.append({"input_ids": prompt + out, "loss_mask": [0] * len(prompt) + [1] * len(out),
                             "rewards": workflow.reward_fn("", text, prompt, out, **row),
                             "sample_ids": row["id"]})
        return pad_sequences_to_tensors(seqs)


class Workflow:
    def __init__(self, reward_fn, n: int = 1) -> None:
        self.reward_fn, self.n = reward_fn, n


def toy_rows(n: int = 20) -> list[dict]:
    return [{"id": i, **format_problem(10 + i, "+", 11)} for i in range(n)]


def gold(row: dict) -> str:
    return row["answer"].split()[-1]


def test_a_policy_answering_one_constant_is_flagged_as_collapse(tiny_tokenizer, tmp_path, caplog):
    rows = toy_rows()
    engine = ScriptedPolicy(tiny_tokenizer, lambda row, i: "#### 21")  # right for row 0 only (10 + 11)
    with caplog.at_level(logging.WARNING, logger="arealite.observe.heldout_eval"):
        out = evaluate(engine, Workflow(toy_reward), rows, EvaluatorConfig(), tiny_tokenizer,
                       log_dir=tmp_path, step=3)
    assert out["eval/majority_share"] == 1.0 and out["eval/gold_majority_share"] == 1 / 20
    assert out["eval/collapse"] == 1.0
    assert any("COLLAPSE" in r.message and "'21'" in r.message for r in caplog.records)
    assert out["eval/right"] == out["eval/exact"] == 1 / 20 and out["eval/score"] == pytest.approx(1 / 20)
    assert out["eval/format"] == 1.0
    kept = [json.loads(line) for line in (tmp_path / COMPLETIONS_FILE).read_text().splitlines()]
    assert len(kept) == 20 and {r["step"] for r in kept} == {3}
    assert {"prompt", "reply", "gold", "right", "exact", "format", "score"} <= set(kept[0])
    assert kept[0]["reply"] == "#### 21" and kept[0]["right"] and not kept[1]["right"]


def test_a_varied_policy_is_not_collapse(tiny_tokenizer):
    rows = toy_rows()
    engine = ScriptedPolicy(tiny_tokenizer, lambda row, i: f"#### {row['id'] % 3}")
    out = evaluate(engine, Workflow(toy_reward), rows, EvaluatorConfig(), tiny_tokenizer)
    assert out["eval/collapse"] == 0.0 and out["eval/majority_share"] == 7 / 20


def test_right_answers_in_the_wrong_format_are_right_not_exact(tiny_tokenizer):
    rows = toy_rows()

    def reply(row, i):  # half restate the sum without the '####' the reward reads
        q = row["question"].removeprefix("What is ").rstrip("?")
        return f"{q} = {gold(row)}" if row["id"] % 2 else f"#### {gold(row)}"

    out = evaluate(ScriptedPolicy(tiny_tokenizer, reply), Workflow(toy_reward), rows,
                   EvaluatorConfig(), tiny_tokenizer)
    assert out["eval/right"] == 1.0 and out["eval/exact"] == 0.5 and out["eval/format"] == 0.5
    assert out["eval/score"] == pytest.approx(0.5) and out["eval/collapse"] == 0.0


def test_pass_at_k_from_sampled_replies(tiny_tokenizer):
    rows = toy_rows(4)

    def reply(row, i):  # row r: its first r samples of 4 are right
        return f"#### {gold(row) if i < row['id'] else 0}"

    cfg = EvaluatorConfig(pass_k=2, pass_n=4)
    out = evaluate(ScriptedPolicy(tiny_tokenizer, reply), Workflow(toy_reward), rows, cfg,
                   tiny_tokenizer, sample_workflow=Workflow(toy_reward, n=4))
    # pass@2 of 4 samples with 0, 1, 2, 3 right: 0, 1/2, 5/6, 1
    assert out["eval/pass@2"] == pytest.approx((0 + 0.5 + 5 / 6 + 1) / 4)
    assert out["eval/pass@2_exact"] == out["eval/pass@2"] and out["eval/pass@2_rows"] == 4


def test_without_answers_only_the_mean_reward_is_measured(tiny_tokenizer):
    rows = [{"id": r["id"], "question": r["question"]} for r in toy_rows(4)]

    def reward(prompt, completion, prompt_ids=None, completion_ids=None, **row):
        return 0.1

    out = evaluate(ScriptedPolicy(tiny_tokenizer, lambda row, i: "7"), Workflow(reward), rows,
                   EvaluatorConfig(), tiny_tokenizer)
    assert out == {"eval/score": pytest.approx(0.1), "eval/n": 4.0}  # never called accuracy


def test_per_task_figures_and_a_collapse_on_one_task(tiny_tokenizer, caplog):
    rows = [{**r, "task": "add" if r["id"] < 10 else "same"} for r in toy_rows()]

    def reply(row, i):
        return f"#### {gold(row)}" if row["task"] == "add" else "#### 1"

    with caplog.at_level(logging.WARNING, logger="arealite.observe.heldout_eval"):
        out = evaluate(ScriptedPolicy(tiny_tokenizer, reply), Workflow(toy_reward), rows,
                       EvaluatorConfig(), tiny_tokenizer)
    assert out["eval/add/right"] == 1.0 and out["eval/same/right"] == 0.0
    assert out["eval/same/collapse"] == 1.0 and out["eval/add/collapse"] == 0.0
    assert out["eval/collapse"] == 0.0 and out["eval/right"] == 0.5  # 50% overall: no collapse
    assert any("COLLAPSE on same" in r.message for r in caplog.records)
