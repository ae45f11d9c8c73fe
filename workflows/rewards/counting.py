"""Reward of the toy visual counting task (``arealite.demo.toy_vision``): 1.0 iff the first
whole number in the completion equals the row's answer. Pure Python, so it runs inline."""

from __future__ import annotations

import re
from typing import Any

from arealite.api.reward_api import inline_reward

_NUMBER = re.compile(r"\d{1,6}")


@inline_reward
def counting_reward(prompt: str, completion: str, prompt_ids: list[int] | None = None,
                    completion_ids: list[int] | None = None, *, answer: str | None = None,
                    **row: Any) -> float:
    """1.0 when the completion's first number equals ``answer`` (a row without one raises)."""
    if answer is None:
        raise ValueError("counting_reward needs the row's `answer`")
    m = _NUMBER.search(completion or "")
    return 1.0 if m is not None and int(m.group(0)) == int(answer) else 0.0
