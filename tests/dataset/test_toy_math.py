import re

import pytest

from arealite.dataset.toy_math import all_problems, generate_toy_math, write_toy_math


def test_answers_are_correct_gsm8k_format():
    for r in generate_toy_math(300, seed=2, split="all"):
        a, op, b = re.match(r"What is (\d+) ([+-]) (\d+)\?", r["question"]).groups()
        want = int(a) + int(b) if op == "+" else int(a) - int(b)
        assert r["answer"].endswith(f"#### {want}")


def test_splits_are_disjoint_and_deterministic():
    train = {r["question"] for r in generate_toy_math(1000, seed=0, split="train")}
    valid = {r["question"] for r in generate_toy_math(1000, seed=0, split="valid")}
    assert train and valid and not (train & valid)
    assert len(train) + len(valid) == len(all_problems())
    assert generate_toy_math(20, seed=5) == generate_toy_math(20, seed=5)
    assert generate_toy_math(20, seed=5) != generate_toy_math(20, seed=6)


def test_bad_split():
    with pytest.raises(ValueError):
        generate_toy_math(3, split="test")


def test_write(tmp_path):
    paths = write_toy_math(tmp_path, 7, 3)
    assert len(paths["valid"].read_text().splitlines()) == 3
