"""A verifiable toy task a tiny model can learn on a CPU: small arithmetic in GSM8K format.

Each row is ``{"id", "question", "answer"}`` with the answer ending in ``#### N`` exactly like
GSM8K, so the same reward (``workflows.rewards``) scores the toy task and real math data. Train
and held-out splits never share a problem: a problem's split is fixed by a hash of the problem
itself, not by its position.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

OPS = ("+", "-")


def _problem(a: int, op: str, b: int) -> dict[str, str]:
    c = a + b if op == "+" else a - b
    return {"question": f"What is {a} {op} {b}?", "answer": f"{a} {op} {b} = {c}\n#### {c}"}


def _is_heldout(a: int, op: str, b: int, seed: int, valid_fraction: float) -> bool:
    h = hashlib.sha256(f"{seed}:{a}{op}{b}".encode()).digest()
    return int.from_bytes(h[:4], "big") / 2**32 < valid_fraction


def all_problems(max_operand: int = 9) -> list[tuple[int, str, int]]:
    """Every problem of the task; subtraction only when the result is non-negative."""
    out = []
    for a in range(max_operand + 1):
        for b in range(max_operand + 1):
            out.append((a, "+", b))
            if a >= b:
                out.append((a, "-", b))
    return out


def generate_toy_math(
    n: int,
    seed: int = 0,
    split: str = "train",
    max_operand: int = 9,
    valid_fraction: float = 0.2,
) -> list[dict[str, Any]]:
    """``n`` rows drawn (with repetition when ``n`` exceeds the split's size) from one split."""
    if split not in ("train", "valid", "all"):
        raise ValueError(f"split must be train, valid or all, not {split!r}")
    pool = [
        p
        for p in all_problems(max_operand)
        if split == "all" or _is_heldout(*p, seed, valid_fraction) == (split == "valid")
    ]
    if not pool:
        raise ValueError("the split is empty; raise max_operand or valid_fraction")
    rng = random.Random(seed * 1000003 + (split == "valid"))
    rng.shuffle(pool)
    picked = pool[:n] if n <= len(pool) else [rng.choice(pool) for _ in range(n)]
    return [{"id": i, **_problem(*p)} for i, p in enumerate(picked)]


def write_toy_math(
    out_dir: str | Path,
    n_train: int = 2000,
    n_valid: int = 100,
    seed: int = 0,
    max_operand: int = 9,
) -> dict[str, Path]:
    """Write ``train.jsonl`` and ``valid.jsonl`` into ``out_dir``; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, n in (("train", n_train), ("valid", n_valid)):
        rows = generate_toy_math(n, seed=seed, split=split, max_operand=max_operand)
        p = out / f"{split}.jsonl"
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
        paths[split] = p
    return paths
