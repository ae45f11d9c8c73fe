"""Math answer matching with ``math-verify``: GSM8K ``#### N`` answers, ``\\boxed{}``, fractions,
decimals, thousands separators and LaTeX expressions.

The gold answer is the row's ``answer`` (GSM8K: the text after ``####``) or ``solution`` (MATH:
its ``\\boxed{}``). The prediction is the text after the completion's last ``####`` when it has
one, else its last ``max_chars`` characters (final answers come last; this bounds the parser's
work on runaway outputs). Plain numbers are compared exactly without sympy; anything else goes
through math-verify with its own time limit (``timeout_seconds``, per parse and per comparison;
it is signal-based, so it is enforced when the reward runs in a pool worker's main thread; on
another thread the pool's call timeout is the limit).
"""

from __future__ import annotations

import re
import threading
from fractions import Fraction
from typing import Any

# Bounded digit counts: a runaway literal is not a plain number (and int() of it would raise).
_PLAIN_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3}){1,20}|\d{1,60})(?:\.\d{1,30})?|[-+]?\.\d{1,30}")
_HASH_TAIL = re.compile(r"####\s*([^\n]*)")


def _plain_number(text: str) -> Fraction | None:
    t = text.strip().rstrip(".").replace("$", "").strip()
    if not _PLAIN_NUMBER.fullmatch(t):
        return None
    return Fraction(t.replace(",", ""))


def gold_text(answer: Any = None, solution: Any = None) -> str:
    if answer is None and solution is None:
        raise ValueError("math_reward: the row has neither `answer` nor `solution`")
    text = str(answer if answer is not None else solution)
    if "####" in text:
        text = text.rsplit("####", 1)[1].strip()
    return text


def prediction_text(completion: str, max_chars: int = 4096) -> str:
    hashes = _HASH_TAIL.findall(completion)
    if hashes:
        return hashes[-1].strip()
    return completion[-max_chars:]


def _parse(text: str, timeout: int | None):
    from math_verify import parse

    out = parse(text, parsing_timeout=timeout)
    if not out and "\\" in text and "$" not in text:  # bare LaTeX, e.g. "\frac{1}{2}"
        out = parse(f"${text}$", parsing_timeout=timeout)
    return out


def math_reward(
    prompt: str,
    completion: str,
    prompt_ids: list[int] | None = None,
    completion_ids: list[int] | None = None,
    *,
    answer: Any = None,
    solution: Any = None,
    timeout_seconds: int = 5,
    max_chars: int = 4096,
    **row: Any,
) -> float:
    """1.0 if the completion's final answer equals the gold answer mathematically, else 0.0."""
    gold = gold_text(answer, solution)
    if not gold:
        raise ValueError("math_reward: the gold answer is empty")
    pred = prediction_text(completion or "", max_chars)
    if not pred.strip():
        return 0.0
    g_num, p_num = _plain_number(gold), _plain_number(pred)
    if g_num is not None and p_num is not None:
        return 1.0 if g_num == p_num else 0.0
    from math_verify import verify

    # math-verify's timeouts use SIGALRM, which only the main thread may arm.
    timeout = timeout_seconds if threading.current_thread() is threading.main_thread() else None
    g, p = _parse(gold, timeout), _parse(pred, timeout)
    if not g or not p:
        return 0.0
    return 1.0 if verify(g, p, timeout_seconds=timeout) else 0.0
