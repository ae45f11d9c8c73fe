"""A verifiable toy task a tiny model can learn on a CPU: digit-wise arithmetic in GSM8K format.

Problems are two-digit additions without carries and subtractions without borrows
(``What is 23 + 41?`` -> ``#### 64``). Each answer digit depends on one digit pair only, so the
skill is compositional: a model that learns the per-digit facts from the training split solves
held-out problems it never saw (single-digit facts, by contrast, can only be memorised, and
held-out accuracy then stays near chance). Rows are ``{"id", "question", "answer"}`` with the
answer ending in ``#### N`` exactly like GSM8K, so the same rewards score the toy task and real
math data. A problem's split is fixed by a hash of the problem, never by its position, so train
and held-out never share a problem.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

Problem = tuple[int, str, int]


def _digitwise_ok(a: int, op: str, b: int) -> bool:
    da, db = str(a), str(b).rjust(len(str(a)), "0")
    if len(str(b)) > len(str(a)):
        return False
    if op == "+":
        return all(int(x) + int(y) <= 9 for x, y in zip(da, db))
    return all(int(x) >= int(y) for x, y in zip(da, db))


def all_problems(digits: int = 2) -> list[Problem]:
    """Every problem: ``digits``-digit operands, no carries (``+``), no borrows (``-``)."""
    lo, hi = 10 ** (digits - 1) if digits > 1 else 0, 10**digits
    return [
        (a, op, b)
        for a in range(lo, hi)
        for b in range(lo, hi)
        for op in ("+", "-")
        if _digitwise_ok(a, op, b)
    ]


def solve(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b


def format_problem(a: int, op: str, b: int) -> dict[str, str]:
    return {"question": f"What is {a} {op} {b}?", "answer": f"#### {solve(a, op, b)}"}


def _is_heldout(p: Problem, seed: int, valid_fraction: float) -> bool:
    h = hashlib.sha256(f"{seed}:{p[0]}{p[1]}{p[2]}".encode()).digest()
    return int.from_bytes(h[:4], "big") / 2**32 < valid_fraction


def generate_toy_math(
    n: int,
    seed: int = 0,
    split: str = "train",
    digits: int = 2,
    valid_fraction: float = 0.2,
) -> list[dict[str, Any]]:
    """``n`` distinct rows of one split (drawn with repetition only when ``n`` exceeds it)."""
    if split not in ("train", "valid", "all"):
        raise ValueError(f"split must be train, valid or all, not {split!r}")
    pool = [
        p
        for p in all_problems(digits)
        if split == "all" or _is_heldout(p, seed, valid_fraction) == (split == "valid")
    ]
    if not pool:
        raise ValueError("the split is empty; change digits or valid_fraction")
    rng = random.Random(f"{seed}:{split}")
    rng.shuffle(pool)
    picked = pool[:n] if n <= len(pool) else [rng.choice(pool) for _ in range(n)]
    return [{"id": i, **format_problem(*p)} for i, p in enumerate(picked)]


def write_toy_math(
    out_dir: str | Path,
    n_train: int = 2000,
    n_valid: int = 200,
    seed: int = 0,
    digits: int = 2,
) -> dict[str, Path]:
    """Write ``train.jsonl`` and ``valid.jsonl`` into ``out_dir``; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, n in (("train", n_train), ("valid", n_valid)):
        rows = generate_toy_math(n, seed=seed, split=split, digits=digits)
        p = out / f"{split}.jsonl"
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
        paths[split] = p
    return paths


WRONG_ANSWERS = ("near", "digit", "mixed")


def _wrong_answer(right: int, rng: random.Random, wrong: str) -> int:
    """``near``: the right number off by 1 to 9 in one direction; ``digit``: one digit of it
    replaced by another (an error in the tens place is as likely as in the units, as a model's
    digit-wise slips are); ``mixed``: either, half the time each."""
    if wrong == "mixed":
        wrong = rng.choice(("near", "digit"))
    if wrong == "near":
        return right + rng.choice([-1, 1]) * rng.randint(1, 9)
    if wrong != "digit":
        raise ValueError(f"wrong must be one of {WRONG_ANSWERS}, not {wrong!r}")
    digits = list(str(abs(right)))
    i = rng.randrange(len(digits))
    digits[i] = rng.choice([d for d in "0123456789" if d != digits[i]])
    return int("".join(digits)) * (-1 if right < 0 else 1)


def toy_preferences(rows: list[dict[str, Any]], seed: int = 0,
                    wrong: str = "near") -> list[dict[str, Any]]:
    """Preference rows from toy rows: ``chosen`` the right answer, ``rejected`` a wrong one
    (``_wrong_answer``: ``near`` by default), ``prompt`` the question."""
    rng = random.Random(f"{seed}:pref")
    out = []
    for r in rows:
        right = int(r["answer"].split("####")[-1])
        bad = _wrong_answer(right, rng, wrong)
        while bad == right:  # a replaced leading digit can give the same number ("05" -> 5)
            bad = _wrong_answer(right, rng, wrong)
        out.append({"id": r["id"], "prompt": r["question"], "chosen": r["answer"],
                    "rejected": f"#### {bad}"})
    return out


def write_toy_preferences(out_dir: str | Path, n_train: int = 2000, n_valid: int = 200,
                          seed: int = 0, wrong: str = "near") -> dict[str, Path]:
    """Write DPO ``train.jsonl`` / ``valid.jsonl`` (``toy_preferences``) into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, n in (("train", n_train), ("valid", n_valid)):
        rows = toy_preferences(generate_toy_math(n, seed=seed, split=split), seed, wrong)
        paths[split] = out / f"{split}.jsonl"
        paths[split].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths
