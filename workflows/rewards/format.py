"""A configurable format check: 1.0 when the completion has the required shape, else 0.0.

Styles (``style=``):
- ``"answer_tag"``: exactly one non-empty ``<answer>...</answer>`` (tag name set by ``tag``);
- ``"think_answer"``: ``<think>...</think>`` then ``<answer>...</answer>``, nothing else around;
- ``"gsm8k"``: the last non-empty line is ``#### <number>``;
- ``"boxed"``: exactly one ``\\boxed{...}`` with balanced braces;
- ``"regex"``: the stripped completion fully matches ``pattern``.

Configure it from the workflow config with ``reward_kwargs`` (bound with ``functools.partial``)
or use ``FormatReward(style=...)`` in code. All patterns here are linear-time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

STYLES = ("answer_tag", "think_answer", "gsm8k", "boxed", "regex")
_GSM8K_LINE = re.compile(r"####\s*[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")


def _one_tag(text: str, tag: str) -> bool:
    opens, closes = text.count(f"<{tag}>"), text.count(f"</{tag}>")
    if opens != 1 or closes != 1:
        return False
    inner = text.split(f"<{tag}>", 1)[1]
    return "</" + tag + ">" in inner and bool(inner.split(f"</{tag}>", 1)[0].strip())


def _one_boxed(text: str) -> bool:
    if text.count("\\boxed{") != 1:
        return False
    depth, i = 0, text.index("\\boxed{") + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return j > i + 1  # non-empty content
    return False


def check_format(completion: str, style: str = "answer_tag", tag: str = "answer",
                 pattern: str | None = None) -> bool:
    if style not in STYLES:
        raise ValueError(f"format style must be one of {STYLES}, got {style!r}")
    text = (completion or "").strip()
    if style == "answer_tag":
        return _one_tag(text, tag)
    if style == "think_answer":
        if not (text.startswith("<think>") and text.endswith(f"</{tag}>")):
            return False
        if not (_one_tag(text, "think") and _one_tag(text, tag)):
            return False
        between = text.split("</think>", 1)[1].split(f"<{tag}>", 1)[0]
        return not between.strip()
    if style == "gsm8k":
        lines = [ln for ln in text.splitlines() if ln.strip()]
        return bool(lines) and _GSM8K_LINE.fullmatch(lines[-1].strip()) is not None
    if style == "boxed":
        return _one_boxed(text)
    if not pattern:
        raise ValueError("format style 'regex' needs a pattern")
    return re.fullmatch(pattern, text, re.DOTALL) is not None


def format_reward(
    prompt: str,
    completion: str,
    prompt_ids: list[int] | None = None,
    completion_ids: list[int] | None = None,
    *,
    style: str = "answer_tag",
    tag: str = "answer",
    pattern: str | None = None,
    **row: Any,
) -> float:
    return 1.0 if check_format(completion, style, tag, pattern) else 0.0


@dataclass(frozen=True)
class FormatReward:
    """A picklable, pre-configured ``format_reward``."""

    style: str = "answer_tag"
    tag: str = "answer"
    pattern: str | None = None

    def __post_init__(self) -> None:
        if self.style not in STYLES:
            raise ValueError(f"format style must be one of {STYLES}, got {self.style!r}")
        if self.style == "regex":
            if not self.pattern:
                raise ValueError("format style 'regex' needs a pattern")
            re.compile(self.pattern)

    def __call__(self, prompt: str, completion: str, prompt_ids=None, completion_ids=None,
                 **row: Any) -> float:
        return 1.0 if check_format(completion, self.style, self.tag, self.pattern) else 0.0
