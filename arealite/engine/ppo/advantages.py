"""PPO/GRPO advantages as plain tensor functions (tested against slow reference loops in
``tests/engine/ppo/test_advantages.py``), in the order the actor applies them: reward
transform, group normalisation of rewards (GRPO), KL shaping into token rewards, GAE, then
optionally group or batch normalisation of the advantages.
"""

from __future__ import annotations

import torch

from arealite.engine.functional import last_true_index


def reward_transform(
    rewards: torch.Tensor,
    reward_bias: float = 0.0,
    reward_scaling: float = 1.0,
    reward_clip: float = float("inf"),
) -> torch.Tensor:
    """``clip((r + bias) * scaling, -clip, clip)``."""
    return ((rewards.float() + reward_bias) * reward_scaling).clamp(-reward_clip, reward_clip)


def group_normalization(
    x: torch.Tensor,
    group_size: int,
    mask: torch.Tensor | None = None,
    eps: float = 1e-6,
    unbiased: bool = False,
) -> torch.Tensor:
    """Normalise within each group of ``group_size`` consecutive rows.

    ``x [B]`` (one reward per sample) or ``x [B, S]`` with a token ``mask`` (advantages: mean
    and std over every masked token of the group's samples). Population std by default, so a
    group whose members are all equal maps to 0 rather than NaN.
    """
    B = x.shape[0]
    if group_size < 1 or B % group_size:
        raise ValueError(f"batch of {B} rows is not a whole number of groups of {group_size}")
    g = x.double().reshape(B // group_size, -1)
    m = torch.ones_like(g) if mask is None else mask.double().reshape(B // group_size, -1)
    cnt = m.sum(1, keepdim=True).clamp_min(1)
    mean = (g * m).sum(1, keepdim=True) / cnt
    var = (((g - mean) * m).square()).sum(1, keepdim=True) / cnt
    if unbiased:
        var = var * cnt / (cnt - 1).clamp_min(1)
    out = (g - mean) / (var.sqrt() + eps) * m
    return out.reshape(x.shape).to(x.dtype if x.is_floating_point() else torch.float32)


def kl_shaped_token_rewards(
    rewards: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    loss_mask: torch.Tensor,
    kl_ctl: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rewards ``[B, S]``: ``-kl_ctl * (logprobs - ref_logprobs)`` on each generated token,
    plus the sample's scalar reward on its last generated token. Returns (token rewards, kl)."""
    lm = loss_mask.bool()
    if ref_logprobs is None or kl_ctl == 0.0:
        kl = torch.zeros_like(logprobs, dtype=torch.float32)
    else:
        kl = torch.where(lm, (logprobs - ref_logprobs).float(), 0.0)
    tok = -kl_ctl * kl
    last = last_true_index(lm)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    tok[rows, last[rows]] += rewards.float()[rows]
    return tok, kl


def gae_advantages(
    token_rewards: torch.Tensor,
    values: torch.Tensor | None,
    loss_mask: torch.Tensor,
    discount: float = 1.0,
    gae_lambda: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the generated tokens of each row.

    The time steps of a row are its ``loss_mask`` tokens in order (tokens the policy did not
    generate, e.g. tool feedback in a multi-turn episode, are skipped). ``values[b, t]`` is the
    value of the state before token t (None: zero values, as in GRPO). After the last generated
    token the episode ends (value 0). Returns (advantages, returns), zero off the mask.
    """
    lm = loss_mask.bool()
    B, S = lm.shape
    r = token_rewards.float()
    v = torch.zeros_like(r) if values is None else values.float()
    # compact the generated tokens of each row to the left, scan right-to-left, scatter back
    n = lm.sum(1)
    order = torch.argsort((~lm).to(torch.int8), dim=1, stable=True)
    rc = torch.gather(r, 1, order)
    vc = torch.gather(v, 1, order)
    adv_c = torch.zeros_like(rc)
    last_gae = torch.zeros(B, dtype=rc.dtype, device=rc.device)
    next_v = torch.zeros_like(last_gae)
    for j in range(int(n.max()) - 1 if B else -1, -1, -1):
        live = j < n
        delta = rc[:, j] + discount * next_v - vc[:, j]
        gae = delta + discount * gae_lambda * last_gae
        last_gae = torch.where(live, gae, last_gae)
        next_v = torch.where(live, vc[:, j], next_v)
        adv_c[:, j] = torch.where(live, gae, 0.0)
    adv = torch.zeros_like(r).scatter_(1, order, adv_c)
    adv = torch.where(lm, adv, 0.0)
    return adv, torch.where(lm, adv + v, 0.0)
