"""The sweep's few-shot prompt: solved train problems of the task, answers in the format the
reward pays, before each held-out question, none of them a held-out problem."""

from __future__ import annotations

import pytest

pytest.importorskip("reasoning_gym")


def test_few_shot_rows_show_the_format_before_each_question():
    from arealite.dataset.reasoning_gym import TaskSpec
    from benchmarks.studies.rg_task_sweep import few_shot_rows
    from workflows.rewards.reasoning_gym import reasoning_gym_reward

    spec = TaskSpec("gcd", 1.0, {"min_value": 1, "max_value": 20})
    plain = few_shot_rows(spec, 4, 0, 0, "direct", "<answer>")
    rows = few_shot_rows(spec, 4, 3, 0, "direct", "<answer>")
    assert [r["question"] for r in rows] == [r["question"] for r in plain]
    held_out = {r["question"] for r in rows}
    for r, p in zip(rows, plain):
        m = r["messages"]
        assert m[0] == p["messages"][0] and m[-2:] == p["messages"][-2:]  # system; question, prefill
        shots = m[1:-2]
        assert [t["role"] for t in shots] == ["user", "assistant"] * 3
        assert not {t["content"] for t in shots[::2]} & held_out
        for ans in shots[1::2]:  # each shown answer in the tags the system prompt asks for
            assert ans["content"].startswith("<answer>") and ans["content"].endswith("</answer>")
    # and a reply continuing the prefill that way is paid in full
    gold = rows[0]["answer"]
    kw = {k: v for k, v in rows[0].items() if k != "prompt"}
    assert reasoning_gym_reward("", f"{gold}</answer>", untagged="whole", **kw) == 1.0
