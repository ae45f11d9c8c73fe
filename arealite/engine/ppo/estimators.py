"""Advantage estimators, one function each, picked by ``PPOActorConfig.adv_estimator``.

Every estimator has the same signature, ``fn(AdvantageInputs) -> AdvantageOutputs``, so adding
one is a function here plus an entry in ``ADVANTAGE_ESTIMATORS`` and in the config's ``Literal``;
the actor only looks the name up. The formulas sit beside their config values in
``docs/algorithms.md``; each is tested against a slow loop in
``tests/engine/ppo/test_estimators.py``.

All estimators see the same rewards (after ``reward_transform``, overlong shaping and the
no-EOS mask) and the same per-token KL to the reference; ``kl_ctl`` puts it in the reward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from arealite.api.config.actor import PPOActorConfig
from arealite.engine.functional import masked_normalization
from arealite.engine.ppo.advantages import (
    gae_advantages,
    group_normalization,
    kl_shaped_token_rewards,
)


@dataclass
class AdvantageInputs:
    rewards: torch.Tensor  # [B] one scalar reward per sample
    kl: torch.Tensor  # [B, S] logp - ref_logp on generated tokens (0 without a reference)
    loss_mask: torch.Tensor  # [B, S] generated tokens
    values: torch.Tensor | None  # [B, S] critic values (gae only)
    config: PPOActorConfig
    reduce_group: Any = None  # process group for batch-level statistics
    # Groups formed by the workflow (agent sessions: several rows per sample), not by runs of
    # ``group_size`` rows: each row's group mean and std of rewards (transformed like them).
    group_baseline: torch.Tensor | None = None  # [B]
    group_scale: torch.Tensor | None = None  # [B]


def _consecutive_groups(inp: AdvantageInputs, name: str) -> int:
    """``group_size``, for estimators that group runs of rows; a clear error when the
    workflow formed its own groups."""
    if inp.group_baseline is not None:
        raise ValueError(f"adv_estimator={name} groups consecutive rows; a workflow that forms "
                         "its own groups (group_baseline) needs adv_estimator=gae with "
                         "group_reward_norm")
    return inp.config.group_size


@dataclass
class AdvantageOutputs:
    advantages: torch.Tensor  # [B, S]
    returns: torch.Tensor  # [B, S]
    token_rewards: torch.Tensor  # [B, S]
    shaped_rewards: torch.Tensor  # [B] the scalar reward after the estimator's baseline


def _token_rewards(shaped: torch.Tensor, inp: AdvantageInputs) -> torch.Tensor:
    """Scalar reward on the last generated token, ``-kl_ctl * kl`` on every generated token."""
    # kl_shaped_token_rewards recomputes kl from logprobs; pass kl as (logprobs, ref=0)
    tok, _ = kl_shaped_token_rewards(shaped, inp.kl, torch.zeros_like(inp.kl), inp.loss_mask,
                                     inp.config.kl_ctl)
    return tok


def _reward_to_go(shaped: torch.Tensor, inp: AdvantageInputs, discount: float = 1.0
                  ) -> AdvantageOutputs:
    """Outcome-reward estimators: advantage = return = discounted sum of the token rewards from
    t on (the scalar, minus the KL still to come when ``kl_ctl > 0``)."""
    tok = _token_rewards(shaped, inp)
    adv, ret = gae_advantages(tok, None, inp.loss_mask, discount, 1.0)
    return AdvantageOutputs(adv, ret, tok, shaped)


def gae(inp: AdvantageInputs) -> AdvantageOutputs:
    """GAE over KL-shaped token rewards, with the optional group reward normalisation and
    group or batch advantage normalisation of the config (PPO with a critic; GRPO as
    ``group_reward_norm=true``). The default, and the pipeline arealite always had."""
    c = inp.config
    lm = inp.loss_mask.bool()
    rewards = inp.rewards
    if c.group_reward_norm and inp.group_baseline is not None:
        rewards = (rewards - inp.group_baseline) / (inp.group_scale + 1e-6)
    elif c.group_reward_norm:
        rewards = group_normalization(rewards, c.group_size)
    tok = _token_rewards(rewards, inp)
    adv, returns = gae_advantages(tok, inp.values, lm, c.discount, c.gae_lambda)
    if c.group_adv_norm:
        adv = group_normalization(adv, c.group_size, mask=lm)
    elif c.adv_norm:
        adv = masked_normalization(adv, lm, reduce_group=inp.reduce_group)
    return AdvantageOutputs(adv, returns, tok, rewards)


def grpo(inp: AdvantageInputs) -> AdvantageOutputs:
    """GRPO (Shao et al. 2024): ``(r - mean_group) / (std_group + eps)``."""
    return _reward_to_go(group_normalization(inp.rewards, _consecutive_groups(inp, "grpo")), inp)


def group_mean_baseline(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """``r - mean_group(r)``."""
    g = rewards.double().reshape(-1, group_size)
    return (g - g.mean(1, keepdim=True)).reshape(rewards.shape).float()


def leave_one_out_baseline(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """``r_i - mean_{j != i} r_j`` within the group (0 for groups of one)."""
    if group_size < 2:
        return torch.zeros_like(rewards, dtype=torch.float32)
    g = rewards.double().reshape(-1, group_size)
    others = (g.sum(1, keepdim=True) - g) / (group_size - 1)
    return (g - others).reshape(rewards.shape).float()


def dr_grpo(inp: AdvantageInputs) -> AdvantageOutputs:
    """Dr.GRPO (Liu et al. 2025): GRPO without the std division, ``r - mean_group``."""
    return _reward_to_go(group_mean_baseline(inp.rewards, _consecutive_groups(inp, "dr_grpo")), inp)


def rloo(inp: AdvantageInputs) -> AdvantageOutputs:
    """RLOO (Ahmadian et al. 2024): leave-one-out baseline, ``r_i - mean_{j != i} r_j``."""
    return _reward_to_go(leave_one_out_baseline(inp.rewards, _consecutive_groups(inp, "rloo")), inp)


def reinforce_pp(inp: AdvantageInputs) -> AdvantageOutputs:
    """REINFORCE++ (Hu 2025): discounted return of the KL-shaped token rewards, no critic,
    normalised over every generated token of the whole batch (all ranks)."""
    out = _reward_to_go(inp.rewards.float(), inp, inp.config.discount)
    out.advantages = masked_normalization(out.advantages, inp.loss_mask.bool(),
                                          reduce_group=inp.reduce_group)
    return out


def reinforce_pp_baseline(inp: AdvantageInputs) -> AdvantageOutputs:
    """REINFORCE++-baseline: group-mean baseline on the reward, then REINFORCE++'s batch
    normalisation."""
    shaped = group_mean_baseline(inp.rewards, _consecutive_groups(inp, "reinforce_pp_baseline"))
    out = _reward_to_go(shaped, inp, inp.config.discount)
    out.advantages = masked_normalization(out.advantages, inp.loss_mask.bool(),
                                          reduce_group=inp.reduce_group)
    return out


ADVANTAGE_ESTIMATORS: dict[str, Callable[[AdvantageInputs], AdvantageOutputs]] = {
    "gae": gae,
    "grpo": grpo,
    "dr_grpo": dr_grpo,
    "rloo": rloo,
    "reinforce_pp": reinforce_pp,
    "reinforce_pp_baseline": reinforce_pp_baseline,
}


def overlong_penalty(gen_len: torch.Tensor, max_len: int, buffer_len: int,
                     factor: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment: 0 up to ``max_len - buffer_len`` generated tokens, then
    falling linearly to ``-factor`` at ``max_len`` (and ``-factor`` beyond)."""
    if buffer_len <= 0 or buffer_len > max_len:
        raise ValueError(f"overlong buffer must be in (0, max_len={max_len}], got {buffer_len}")
    expected = max_len - buffer_len
    over = (gen_len.float() - expected).clamp(min=0.0)
    return -factor * (over / buffer_len).clamp(max=1.0)
