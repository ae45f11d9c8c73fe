"""The held-out evaluation's plain functions: pass@k against a slow enumeration, the lenient
answer extraction, and right / exact / format told apart by the tasks' own checkers."""

from __future__ import annotations

import itertools
import math

import pytest

from arealite.observe import heldout_grading as hg


def pass_at_k_by_enumeration(n: int, c: int, k: int) -> float:
    """Every k-subset of n samples (the first c right): the share holding a right one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8, 10])
def test_pass_at_k_is_the_enumerated_share(n):
    for k in range(1, n + 1):
        for c in range(n + 1):
            assert math.isclose(hg.pass_at_k(n, c, k), pass_at_k_by_enumeration(n, c, k),
                                abs_tol=1e-12), (n, c, k)


def test_pass_at_k_refuses_impossible_counts():
    for n, c, k in ((4, 5, 1), (4, 1, 5), (4, 1, 0), (3, -1, 1)):
        with pytest.raises(ValueError):
            hg.pass_at_k(n, c, k)


def test_answer_span_takes_the_last_answer_shaped_span():
    assert hg.answer_span("3 + 4 = 7", numeric=True)[0] == "7"
    assert hg.answer_span("The sum of -3 and -9 is -12.", numeric=True)[0] == "-12"
    assert hg.answer_span("<answer>5</answer> and then 9", numeric=True)[0] == "5"
    assert hg.answer_span("no digits here", numeric=True) is None
    text = "Let me think.\nAnswer: <b>Paris</b>."
    span = hg.answer_span(text, numeric=False)
    assert span[0] == "Paris" and text[span[1]:span[2]] == "Paris"
    assert hg.answer_span("1,234 apples", numeric=True)[0] == "1,234"
    assert hg.gold_span("#### 64")[0] == "64" and hg.gold_span("<answer>x</answer>")[0] == "x"


def test_majority_share_and_collapse():
    assert hg.majority_share(["1", "1", "2", None]) == (0.5, "1")
    assert hg.majority_share([None, None]) == (0.0, None)
    assert hg.is_collapse(0.9, 0.27) and not hg.is_collapse(0.5, 0.2) and not hg.is_collapse(0.6, 0.3)
    assert hg.normalize("7.0") == hg.normalize("7") and hg.normalize(" Paris ") == "paris"


def _toy_payer(prompt: str = ""):
    from workflows.rewards.toy import toy_reward

    return lambda gold: (lambda completion: toy_reward(prompt, completion, answer=gold))


def test_right_differs_from_exact_on_a_misformatted_right_answer_toy_reward():
    pays = _toy_payer()("#### 64")
    tpl = hg.gold_template("#### 64", pays, 1.0)
    cases = {  # reply -> (right, exact, format)
        "#### 64": (True, True, True),
        "23 + 41 = 64": (True, False, False),  # right, but the reward reads only '#### N'
        "#### 63": (False, False, True),
        "I do not know": (False, False, False),
    }
    for reply, want in cases.items():
        g = hg.grade(reply, "#### 64", pays(reply), pays, 1.0, tpl)
        assert (g.right, g.exact, g.format) == want, reply


def test_reasoning_gym_partial_credit_is_a_score_not_a_right_answer():
    pytest.importorskip("reasoning_gym")
    from arealite.dataset.reasoning_gym import build_rows
    from workflows.rewards.reasoning_gym import reasoning_gym_reward

    (row,) = build_rows([hg_task()], 1, seed=0, split="valid", system_prompt="direct",
                        answer_prefix="<answer>")
    gold = str(row["answer"])
    kwargs = {k: v for k, v in row.items() if k != "prompt"}

    def pays(completion: str) -> float:  # the job's own reward: untagged replies taken whole
        return reasoning_gym_reward("", completion, untagged="whole", **kwargs)

    tpl = hg.gold_template(gold, pays, 1.0)
    assert tpl is not None
    restated = f"The answer is {gold}."
    wrong = str(int(gold) + 10)
    g_right = hg.grade(restated, gold, pays(restated), pays, 1.0, tpl)
    g_exact = hg.grade(gold, gold, pays(gold), pays, 1.0, tpl)
    g_wrong = hg.grade(wrong, gold, pays(wrong), pays, 1.0, tpl)
    assert (g_right.right, g_right.exact, g_right.format) == (True, False, False)
    assert (g_exact.right, g_exact.exact, g_exact.format) == (True, True, True)
    assert (g_wrong.right, g_wrong.exact, g_wrong.format) == (False, False, True)
    assert 0.0 <= g_wrong.score < 1.0  # the task's partial credit, kept as the score


def hg_task():
    from arealite.dataset.reasoning_gym import TaskSpec

    return TaskSpec("chain_sum", 1.0, {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1})
