"""A neural reward model beside the rule rewards: ``ModelRewardTerm`` scores a sample (prompt +
completion tokens) through a ``RewardModelScorer`` (the reward-model server pool) and combines
the score with the sample's rule reward:

- ``mode="sum"``: ``rule_weight · rule + model_weight · score``;
- ``mode="gate"``: ``model_weight · score`` when the rule reward (a format check, say) is
  positive, else ``gate_fail`` without asking the model; ``gate_fail`` should sit below the
  scores the model gives (a model trained with ``center_coef`` keeps them near 0).

A workflow awaits ``combine`` per sample as soon as that sample is generated, on its own event
loop, so the scoring of one sample overlaps the generation of the others (in its group and in
other episodes); the servers batch the concurrent requests. A failed score (a 4xx such as a
sequence longer than the reward model's context, or a pool out of retries) is counted as a
reward error and follows the workflow's ``reward_failure`` policy: the episode is rejected, or
(``"zero"``) the score counts as 0.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from arealite.api.reward_api import RewardFailed, count_reward
from arealite.api.reward_model_api import RewardModelScorer

logger = logging.getLogger("workflows.rewards.model")

COMBINE_MODES = ("sum", "gate")


def combine_rewards(rule: float, score: float | None, mode: str = "sum",
                    model_weight: float = 1.0, rule_weight: float = 1.0,
                    gate_fail: float = -1.0) -> float:
    """The sample's reward from its rule reward and model score (``score`` may be None only
    where ``gate`` does not pass)."""
    if mode == "sum":
        return rule_weight * rule + model_weight * float(score)
    if mode == "gate":
        return model_weight * float(score) if rule > 0 else gate_fail
    raise ValueError(f"combine mode must be one of {COMBINE_MODES}, got {mode!r}")


@dataclass
class ModelRewardTerm:
    scorer: RewardModelScorer
    mode: str = "sum"
    model_weight: float = 1.0
    rule_weight: float = 1.0
    gate_fail: float = -1.0

    def __post_init__(self) -> None:
        if self.mode not in COMBINE_MODES:
            raise ValueError(f"reward_model_combine mode must be one of {COMBINE_MODES}, got "
                             f"{self.mode!r}")
        if not isinstance(self.scorer, RewardModelScorer):
            raise TypeError(f"reward_model must be a RewardModelScorer, got "
                            f"{type(self.scorer).__name__}")

    def needs_score(self, rule: float) -> bool:
        return self.mode == "sum" or rule > 0

    async def combine(self, sequence: list[int], rule: float,
                      reward_failure: str = "reject") -> float:
        """The combined reward of one sample (``sequence``: prompt + completion ids)."""
        if not self.needs_score(rule):
            return combine_rewards(rule, None, self.mode, self.model_weight, self.rule_weight,
                                   self.gate_fail)
        try:
            (score,) = await self.scorer.ascore_batch([sequence])
        except Exception as e:  # noqa: BLE001 - every failure is counted and handled alike
            count_reward("errors")
            logger.warning("reward-model score failed (%s): %s", reward_failure, e)
            if reward_failure != "zero":
                raise RewardFailed(f"reward-model score failed: {e}") from e
            score = 0.0
        return combine_rewards(rule, score, self.mode, self.model_weight, self.rule_weight,
                               self.gate_fail)
