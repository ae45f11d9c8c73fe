import re

import pytest

from arealite.demo.toy_math import all_problems, generate_toy_math, solve, write_toy_math


def test_answers_are_correct_gsm8k_format():
    rows = generate_toy_math(500, seed=2, split="all")
    for r in rows:
        a, op, b = re.fullmatch(r"What is (\d+) ([+-]) (\d+)\?", r["question"]).groups()
        want = solve(int(a), op, int(b))
        assert r["answer"] == f"#### {want}"
        # digit-wise: no carries, no borrows
        for x, y in zip(a, b.rjust(len(a), "0")):
            assert (int(x) + int(y) <= 9) if op == "+" else (int(x) >= int(y))
    assert len({r["question"] for r in rows}) == len(rows)


def test_splits_are_disjoint_and_deterministic():
    train = {r["question"] for r in generate_toy_math(10**6, seed=0, split="train")}
    valid = {r["question"] for r in generate_toy_math(10**6, seed=0, split="valid")}
    assert train and valid and not (train & valid)
    assert len(train) + len(valid) == len(all_problems())
    assert 0.1 < len(valid) / len(all_problems()) < 0.3
    assert generate_toy_math(20, seed=5) == generate_toy_math(20, seed=5)
    assert generate_toy_math(20, seed=5) != generate_toy_math(20, seed=6)


def test_one_digit_variant():
    assert all(a < 10 and b < 10 for a, _, b in all_problems(1))


def test_bad_split():
    with pytest.raises(ValueError):
        generate_toy_math(3, split="test")


def test_write(tmp_path):
    paths = write_toy_math(tmp_path, 7, 3)
    assert len(paths["valid"].read_text().splitlines()) == 3


def test_preference_wrong_answers_near_digit_mixed():
    from arealite.demo.toy_math import toy_preferences

    rows = generate_toy_math(300, seed=2)
    for wrong in ("near", "digit", "mixed"):
        prefs = toy_preferences(rows, seed=2, wrong=wrong)
        kinds = set()
        for r in prefs:
            right, bad = (int(r[k].split("####")[-1]) for k in ("chosen", "rejected"))
            assert bad != right
            a, b = str(abs(right)), str(abs(bad))
            near, digit = 1 <= abs(bad - right) <= 9, len(a) == len(b) and sum(
                x != y for x, y in zip(a, b)) == 1
            assert near or digit or wrong != "near", r
            kinds.add("tens" if abs(bad - right) >= 10 else "units")
        assert ("tens" in kinds) == (wrong != "near"), wrong
    assert toy_preferences(rows, seed=2) == toy_preferences(rows, seed=2, wrong="near")
    with pytest.raises(ValueError, match="wrong must be one of"):
        toy_preferences(rows, wrong="far")
