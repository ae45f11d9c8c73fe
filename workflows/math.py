"""RLVR for math: ``math_reward`` (math-verify) for correctness plus an optional format term."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from arealite.api.config.rollout import GenerationHyperparameters
from workflows.rewards.combine import WeightedSum
from workflows.rewards.format import FormatReward
from workflows.rewards.math import math_reward
from workflows.rlvr import RLVRWorkflow


class MathRLVRWorkflow(RLVRWorkflow):
    """``reward = correctness + format_weight * format``.

    Args:
        reward_fn: the correctness reward; None uses ``math_reward``.
        math_timeout: math-verify's own time limit (seconds) when ``reward_fn`` is None.
        format_weight: weight of the format term; 0 disables it.
        format_style / format_tag / format_pattern: see ``workflows.rewards.format``.
        Everything else as ``RLVRWorkflow``.
    """

    def __init__(
        self,
        reward_fn: Callable[..., float] | None = None,
        gconfig: GenerationHyperparameters | None = None,
        tokenizer: Any = None,
        *,
        math_timeout: int = 5,
        format_weight: float = 0.0,
        format_style: str = "gsm8k",
        format_tag: str = "answer",
        format_pattern: str | None = None,
        **rlvr_kwargs: Any,
    ):
        if gconfig is None:
            raise ValueError("MathRLVRWorkflow needs gconfig")
        correctness = reward_fn or functools.partial(math_reward, timeout_seconds=int(math_timeout))
        if format_weight:
            fmt = FormatReward(style=format_style, tag=format_tag, pattern=format_pattern)
            reward: Callable[..., float] = WeightedSum([(correctness, 1.0), (fmt, float(format_weight))])
        else:
            reward = correctness
        super().__init__(reward, gconfig, tokenizer, **rlvr_kwargs)
