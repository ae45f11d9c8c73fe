"""Combine rewards: ``WeightedSum([(math_reward, 1.0), (FormatReward("answer_tag"), 0.1)])``.

Picklable when its terms are, so it runs in the reward pool as one call; it runs inline only
when every term is marked inline.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from arealite.api.reward_api import is_inline


class WeightedSum:
    def __init__(self, terms: Sequence[tuple[Callable[..., float], float]]):
        if not terms:
            raise ValueError("WeightedSum needs at least one (reward_fn, weight) term")
        for fn, w in terms:
            if not callable(fn):
                raise TypeError(f"WeightedSum term {fn!r} is not callable")
            float(w)
        self.terms = [(fn, float(w)) for fn, w in terms]
        self.arealite_inline = all(is_inline(fn) for fn, _ in self.terms)

    def __call__(self, prompt: str, completion: str, prompt_ids=None, completion_ids=None,
                 **row: Any) -> float:
        return sum(w * float(fn(prompt, completion, prompt_ids, completion_ids, **row))
                   for fn, w in self.terms)

    def __repr__(self) -> str:
        names = ", ".join(f"{getattr(f, '__name__', f)}*{w}" for f, w in self.terms)
        return f"WeightedSum({names})"
