from fractions import Fraction

import pytest

from arealite.api.reward_api import is_inline
from arealite.demo.toy_math import generate_toy_math
from workflows.rewards.toy import extract_hash_answer, toy_reward


def test_toy_reward_on_generated_rows():
    rows = generate_toy_math(40, seed=3, split="all")
    for r in rows:
        gold = r["answer"].split("####")[1].strip()
        assert toy_reward(r["question"], f"work\n#### {gold}", [], [], **r) == 1.0
        assert toy_reward(r["question"], f"#### {int(gold) + 1}", [], [], **r) == 0.0
        assert toy_reward(r["question"], r["answer"], [], [], **r) == 1.0


@pytest.mark.parametrize("text,value", [
    ("#### 12", Fraction(12)), ("####-3", Fraction(-3)), ("x #### 1,234 y", Fraction(1234)),
    ("#### 2.50", Fraction(5, 2)), ("no answer", None), ("#### ", None), ("", None),
    ("#### 5\n#### 6", Fraction(5)),  # the first answer counts: no credit for listing several
])
def test_extract_hash_answer(text, value):
    assert extract_hash_answer(text) == value


def test_toy_reward_bad_rows_and_inline_flag():
    assert is_inline(toy_reward)
    with pytest.raises(ValueError, match="answer"):
        toy_reward("q", "#### 1", [], [])
    with pytest.raises(ValueError, match="####"):
        toy_reward("q", "#### 1", [], [], answer="1")
    assert toy_reward("q", "#### 7" + "9" * 10000, [], [], answer="#### 7") == 0.0
