"""The algorithm choices of the PPO actor (advantage estimator, policy loss, loss aggregation,
train–inference mismatch correction, DAPO's overlong shaping), mixed into ``PPOActorConfig``.

Each ``Literal`` value names one function in a registry of ``arealite.engine.ppo`` (the engine
looks the name up and never branches on it); formulas and when to pick each:
``docs/algorithms.md``. Every default keeps the behaviour arealite had before the choices.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class PPOAlgorithmOptions(BaseModel):
    """Algorithm fields of ``PPOActorConfig`` (a mixin: ``config.py`` stays small)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    adv_estimator: Literal[
        "gae", "grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"
    ] = Field("gae", description="Advantage estimator; group_reward_norm, group_adv_norm, "
              "adv_norm, gae_lambda and critic values apply to gae only.")
    policy_loss: Literal["ppo", "gspo", "cispo"] = Field(
        "ppo", description="Policy loss: PPO clip, GSPO (sequence ratio) or CISPO (clipped IS "
        "weight, detached).")
    loss_agg_mode: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"] = (
        Field("token_mean", description="How token losses reduce to the batch loss."))
    loss_agg_norm: float | None = Field(
        None, gt=0, description="Constant divisor of seq_mean_token_sum_norm (Dr.GRPO; e.g. "
        "max_new_tokens).")
    behav_imp_weight_level: Literal["token", "sequence", "geometric"] = Field(
        "token", description="Behaviour IS weight per token, per sample (product) or per sample "
        "(geometric mean).")
    behav_imp_weight_mode: Literal["mask", "truncate"] = Field(
        "mask", description="Beyond behav_imp_weight_cap: weight 0 (masked IS) or cap (TIS).")
    behav_imp_weight_floor: float | None = Field(
        None, gt=0, description="Mask weights below this too (two-sided mask, IcePop); mode=mask.")
    overlong_max_len: int | None = Field(
        None, ge=1, description="DAPO overlong shaping: generated length of the full penalty.")
    overlong_buffer_len: int | None = Field(
        None, ge=1, description="Tokens before overlong_max_len over which the penalty ramps.")
    overlong_penalty_factor: float = Field(
        1.0, ge=0, description="Size of the overlong penalty at overlong_max_len.")
    dynamic_sampling: bool = Field(
        False, description="DAPO dynamic sampling: drop groups whose rewards are all equal and "
        "draw more until the batch is full.")

    @model_validator(mode="after")
    def _check_algorithm(self) -> PPOAlgorithmOptions:
        if self.adv_estimator != "gae" and (getattr(self, "group_reward_norm", False)
                                            or getattr(self, "group_adv_norm", False)):
            raise ValueError("group_reward_norm/group_adv_norm belong to adv_estimator=gae")
        if self.policy_loss == "cispo" and getattr(self, "c_clip", None) is not None:
            raise ValueError("c_clip (dual clip) does not apply to policy_loss=cispo")
        if self.loss_agg_mode == "seq_mean_token_sum_norm" and self.loss_agg_norm is None:
            raise ValueError("loss_agg_mode=seq_mean_token_sum_norm needs loss_agg_norm")
        if self.behav_imp_weight_floor is not None and self.behav_imp_weight_mode != "mask":
            raise ValueError("behav_imp_weight_floor needs behav_imp_weight_mode=mask")
        if (self.overlong_max_len is None) != (self.overlong_buffer_len is None):
            raise ValueError("set both overlong_max_len and overlong_buffer_len, or neither")
        if self.overlong_max_len is not None and self.overlong_buffer_len > self.overlong_max_len:
            raise ValueError("overlong_buffer_len must be <= overlong_max_len")
        return self
