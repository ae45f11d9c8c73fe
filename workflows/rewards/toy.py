"""Reward of the toy arithmetic task (``arealite.demo.toy_math``): 1.0 iff the completion's
``#### N`` answer equals the row's. Pure Python and microseconds per call, so it runs inline
(see ``arealite.api.reward_api.inline_reward``)."""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from arealite.api.reward_api import inline_reward

# A number after '####': optional sign, digits with optional thousands commas, optional decimals.
# At most ~60 digits, and not a prefix of a longer number (huge literals are never answers here,
# and converting them would be slow).
_HASH_ANSWER = re.compile(
    r"####\s*([-+]?(?:\d{1,3}(?:,\d{3}){1,20}|\d{1,60})(?:\.\d{1,30})?)(?![\d.,]*\d)")


def extract_hash_answer(text: str) -> Fraction | None:
    """The number after the first ``####`` (GSM8K style) as an exact Fraction, or None."""
    m = _HASH_ANSWER.search(text or "")
    if m is None:
        return None
    return Fraction(m.group(1).replace(",", ""))


@inline_reward
def toy_reward(
    prompt: str,
    completion: str,
    prompt_ids: list[int] | None = None,
    completion_ids: list[int] | None = None,
    *,
    answer: str | None = None,
    **row: Any,
) -> float:
    """1.0 when the first ``#### N`` of ``completion`` equals the row's ``answer``'s, else 0.0.
    A row without a ``#### N`` answer is a data error (raises; counted as a reward error)."""
    if answer is None:
        raise ValueError("toy_reward: the row has no `answer` field")
    gold = extract_hash_answer(str(answer))
    if gold is None:
        raise ValueError(f"toy_reward: the row's answer has no '#### N': {answer!r:.80}")
    pred = extract_hash_answer(completion)
    return 1.0 if pred is not None and pred == gold else 0.0
