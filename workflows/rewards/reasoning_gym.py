"""Reward of reasoning-gym rows (``arealite.dataset.reasoning_gym``): the task's own verifier.

The answer is reasoning-gym's own extraction (``reasoning_gym.utils.extract_answer``: the last
``<answer>...</answer>``, which the rows' system prompt asks for); the score is the task's own
``score_answer(answer, entry)``, in [0, 1] (some tasks give partial credit). A completion with
no answer tag is given ``None`` (most verifiers score it 0) unless ``untagged="whole"``, which
passes the whole stripped completion instead (for models that answer without the tag). When the
row's prompt ends with a prefilled assistant turn (``answer_prefix="<answer>"`` in
``arealite.dataset.reasoning_gym``), the reply is that prefix followed by the completion; an
untagged reply's answer is then the completion (``"7</answer>"`` -> ``7``, ``" 7"`` -> ``7``).

It is not inline: it runs in the reward pool, so a verifier that raises or hangs fails the call
(the episode is rejected and counted), never scores 0 silently. Each worker builds a task's
dataset object once (with the row's ``task_config``) and reuses it.
"""

from __future__ import annotations

import functools
import json
from typing import Any

UNTAGGED = ("none", "whole")


@functools.lru_cache(maxsize=64)
def _verifier(task: str, config_json: str):
    import reasoning_gym

    # The verifier of the task as configured (some read their config); size and seed only
    # matter to the generator, which is not used here.
    return reasoning_gym.create_dataset(
        task, size=1, seed=0, **json.loads(config_json)
    ).score_answer


def extract(completion: str, untagged: str = "none", prefix: str = "") -> str | None:
    """The answer a reasoning-gym verifier is given for ``completion``, which continues
    ``prefix`` (the prompt's prefilled start of the reply, e.g. ``"<answer>"``)."""
    from reasoning_gym.utils import extract_answer

    if untagged not in UNTAGGED:
        raise ValueError(f"untagged must be one of {UNTAGGED}, not {untagged!r}")
    ans = extract_answer(prefix + (completion or ""))
    if ans is None and untagged == "whole":
        ans = (completion or "").strip() or None
    return ans


def reasoning_gym_reward(
    prompt: str,
    completion: str,
    prompt_ids: list[int] | None = None,
    completion_ids: list[int] | None = None,
    *,
    task: str | None = None,
    question: str = "",
    answer: Any = None,
    metadata: dict[str, Any] | None = None,
    task_config: dict[str, Any] | None = None,
    messages: list[dict[str, Any]] | None = None,
    untagged: str = "none",
    full_credit_only: bool = False,
    **row: Any,
) -> float:
    """The task's ``score_answer`` on the completion's answer (a row without ``task`` raises).
    ``full_credit_only``: 1.0 for a score of 1.0, else 0.0, so a near-miss that a task gives
    partial credit (``12`` for ``2``) is not paid: the reward pays for right answers only."""
    if not task:
        raise ValueError(
            "reasoning_gym_reward needs the row's `task` (rows from arealite.dataset.reasoning_gym)"
        )
    score = _verifier(task, json.dumps(task_config or {}, sort_keys=True))
    entry = {"question": question, "answer": answer, "metadata": metadata or {}}
    # a prompt that ends with an assistant turn was continued: the reply starts with its text
    prefix = messages[-1]["content"] if messages and messages[-1].get("role") == "assistant" else ""
    value = float(score(extract(completion, untagged, prefix), entry))
    return (1.0 if value == 1.0 else 0.0) if full_credit_only else value
