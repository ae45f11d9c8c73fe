"""The task's reward and its grader (the same rule, so training and evaluation agree)."""

import re

from arealite.api.reward_api import inline_reward

_FIRST_NUMBER = re.compile(r"-?\d+")


def grade(completion: str, answer: str) -> bool:
    """Correct when the first number in the completion is the answer."""
    m = _FIRST_NUMBER.search(completion)
    return m is not None and m.group() == answer


@inline_reward  # microseconds per call: no need for the reward process pool
def reward(prompt: str, completion: str, prompt_ids=None, completion_ids=None, *,
           answer: str, **row) -> float:
    """1 for the right number; 0.1 for a wrong number (a model built from scratch rarely
    writes a number at first, and this credit gives GRPO a signal to start from); else 0."""
    if grade(completion, answer):
        return 1.0
    return 0.1 if _FIRST_NUMBER.search(completion) else 0.0
