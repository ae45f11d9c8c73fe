"""The math of PPO/GRPO as plain tensor functions (tested against slow reference loops).

Argument names follow AReaL's (``logprobs``, ``proximal_logprobs``, ``old_logprobs``, ...) so
results can be compared with its functions. Three policies appear in the decoupled loss:

- ``old_logprobs``: the *behaviour* policy, i.e. the logprobs the inference server reported when
  it sampled the tokens (possibly several weight versions old: asynchronous RL);
- ``proximal_logprobs``: the *proximal* policy, logprobs recomputed by the trainer with the
  weights it holds before this update (``recompute_logprob``);
- ``logprobs``: the policy being optimised (with gradients).

Semantics of the two switches (``PPOActorConfig``):

- ``use_decoupled_loss=True`` (needs ``recompute_logprob``): PPO's ratio and clipping are taken
  against the proximal policy, and each token's loss is multiplied by the detached behaviour
  importance weight ``exp(proximal - old)``, masked (or capped) by ``behav_imp_weight_cap``.
  This corrects for the staleness of asynchronous rollouts while keeping the trust region
  around a policy the trainer actually had.
- ``use_decoupled_loss=False, recompute_logprob=True``: standard PPO with the recomputed
  logprobs as the "old" policy; the behaviour logprobs are only used for statistics.
- ``recompute_logprob=False`` (decoupled must be off): standard PPO against the behaviour
  logprobs reported by the servers; no trainer forward pass before the update.

In the loss functions tensors may be ``[T]`` (packed) or ``[B, S]``; masks select the tokens.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

# --------------------------------------------------------------------------- logprobs


def _chunked(logits: torch.Tensor, chunk_size: int):
    n = logits.shape[0]
    step = max(1, int(chunk_size))
    for i in range(0, n, step):
        yield slice(i, min(n, i + step))


def gather_logprobs(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0, chunk_size: int = 1024
) -> torch.Tensor:
    """``log_softmax(logits / temperature)[i, labels[i]]`` for ``logits [N, V]``, in row chunks.

    Written as ``logit[label] - logsumexp(logits)``: autograd then keeps no ``[N, V]``
    softmax per chunk (logsumexp's backward recomputes it from the logits), so chunking bounds
    the peak memory of forward *and* backward to one ``[chunk, V]`` temporary.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    outs = []
    for sl in _chunked(logits, chunk_size):
        x = logits[sl].float()
        if temperature != 1.0:
            x = x / temperature
        picked = x.gather(-1, labels[sl].long().unsqueeze(-1)).squeeze(-1)
        outs.append(picked - torch.logsumexp(x, dim=-1))
    return torch.cat(outs) if outs else logits.new_zeros(0, dtype=torch.float32)


@torch.no_grad()
def gather_logprobs_entropy(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0, chunk_size: int = 1024
) -> tuple[torch.Tensor, torch.Tensor]:
    """Label logprobs and the entropy of ``softmax(logits / temperature)`` per row (no grad)."""
    lps, ents = [], []
    for sl in _chunked(logits, chunk_size):
        x = logits[sl].float() / temperature
        logp = torch.log_softmax(x, dim=-1)
        lps.append(logp.gather(-1, labels[sl].long().unsqueeze(-1)).squeeze(-1))
        ents.append(-(logp.exp() * logp).sum(-1))
    if not lps:
        z = logits.new_zeros(0, dtype=torch.float32)
        return z, z.clone()
    return torch.cat(lps), torch.cat(ents)


# --------------------------------------------------------------------------- normalisation


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    if mask is None:
        return x.float().mean()
    m = mask.to(x.dtype)
    return (x * m).sum() / m.sum().clamp_min(1)


@torch.no_grad()
def masked_normalization(
    x: torch.Tensor,
    mask: torch.Tensor | None = None,
    dim: int | tuple[int, ...] | None = None,
    unbiased: bool = False,
    eps: float = 1e-5,
    high_precision: bool = True,
    all_reduce: bool = True,
    reduce_group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """``(x - mean) / (std + eps)`` over the masked entries, with the moments summed across the
    ranks of ``reduce_group`` (when torch.distributed is initialised and ``all_reduce``), so
    every rank normalises with the global batch statistics. Masked-out entries return 0."""
    dtype = torch.float64 if high_precision else torch.float32
    xd = x.to(dtype)
    dims = tuple(range(x.dim())) if dim is None else ((dim,) if isinstance(dim, int) else dim)
    m = torch.ones_like(xd) if mask is None else mask.to(dtype)
    xd = xd * m
    count = m.sum(dims, keepdim=True)
    s1 = xd.sum(dims, keepdim=True)
    s2 = xd.square().sum(dims, keepdim=True)
    if all_reduce and dist.is_available() and dist.is_initialized():
        stacked = torch.cat([count.reshape(-1), s1.reshape(-1), s2.reshape(-1)])
        dev = stacked.device
        if dist.get_backend(reduce_group) == "nccl" and dev.type != "cuda":
            stacked = stacked.cuda()
        dist.all_reduce(stacked, group=reduce_group)
        count, s1, s2 = (t.reshape(count.shape).to(dev) for t in stacked.chunk(3))
    mean = s1 / count.clamp_min(1)
    var = (s2 / count.clamp_min(1) - mean.square()).clamp_min(0)
    if unbiased:
        var = var * count / (count - 1).clamp_min(1)
    return (((xd - mean) / (var.sqrt() + eps)) * m).float()


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


# --------------------------------------------------------------------------- advantages


def last_true_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last True per row of ``[B, S]`` (-1 for an all-False row)."""
    S = mask.shape[1]
    idx = torch.arange(S, device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), idx, torch.full_like(idx, -1)).max(1).values


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


# --------------------------------------------------------------------------- losses


def ppo_actor_loss_fn(
    logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor | None,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    loss_mask: torch.Tensor,
    c_clip: float | None = None,
    behav_imp_weight_cap: float | None = None,
    eps_clip_higher: float | None = None,
    behav_imp_weight_mode: str = "mask",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The (decoupled) PPO policy loss, mean over the ``loss_mask`` tokens.

    ``proximal_logprobs=None`` is standard PPO against ``old_logprobs``. Otherwise the ratio
    ``exp(logprobs - proximal_logprobs)`` is clipped to ``[1 - eps_clip, 1 + eps_clip_higher]``
    (``eps_clip_higher`` defaults to ``eps_clip``); with ``c_clip`` the loss of a negative
    advantage is bounded by ``c_clip * |A|`` (dual clip); each token's loss is multiplied by the
    detached behaviour weight ``exp(proximal - old)``. ``behav_imp_weight_cap`` masks tokens
    whose weight exceeds it (``behav_imp_weight_mode="mask"``, AReaL's behaviour: they stay in
    the denominator) or truncates the weight to it (``"truncate"``).
    Returns (loss, per-token detached stats).
    """
    lm = loss_mask.bool()
    count = lm.sum().clamp_min(1)
    ref = old_logprobs if proximal_logprobs is None else proximal_logprobs
    ratio = torch.where(lm, torch.exp(logprobs - ref.detach()), 0.0)
    hi = eps_clip if eps_clip_higher is None else eps_clip_higher
    clipped = ratio.clamp(1.0 - eps_clip, 1.0 + hi)
    loss1 = -advantages * ratio
    loss2 = -advantages * clipped
    clip_mask = (loss1.detach() < loss2.detach()) & lm
    loss = torch.maximum(loss1, loss2)
    if c_clip is not None:
        if c_clip <= 1.0:
            raise ValueError(f"c_clip must be > 1, got {c_clip}")
        loss3 = c_clip * advantages.abs()
        dual_mask = (loss3.detach() < loss.detach()) & lm
        loss = torch.minimum(loss, loss3)
    else:
        dual_mask = torch.zeros_like(lm)
    stats: dict[str, torch.Tensor] = {}
    if proximal_logprobs is not None:
        behav_kl = (proximal_logprobs - old_logprobs).detach()
        w = behav_kl.exp()
        behav_mask = lm
        if behav_imp_weight_cap is not None:
            if behav_imp_weight_mode == "mask":
                behav_mask = lm & (w <= behav_imp_weight_cap)
            elif behav_imp_weight_mode == "truncate":
                w = w.clamp(max=behav_imp_weight_cap)
            else:
                raise ValueError(f"behav_imp_weight_mode must be mask or truncate, not "
                                 f"{behav_imp_weight_mode!r}")
        w = torch.where(behav_mask, w, 0.0)
        loss = loss * w
        stats["behave_imp_weight"] = w
        stats["behave_approx_kl"] = torch.where(behav_mask, behav_kl, 0.0)
        stats["behave_mask"] = behav_mask
    loss = torch.where(lm, loss, 0.0)
    stats.update(
        loss=loss.detach(),
        importance_weight=ratio.detach(),
        approx_kl=torch.where(lm, (logprobs - ref).detach(), 0.0),
        clip_mask=clip_mask,
        dual_clip_mask=dual_mask,
    )
    return loss.sum() / count, stats


def ppo_critic_loss_fn(
    value: torch.Tensor,
    old_value: torch.Tensor,
    target_value: torch.Tensor,
    value_eps_clip: float | None,
    loss_mask: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss ``0.5 * max((v - R)^2, (clip(v, v_old ± eps) - R)^2)``, mean over mask.
    ``value_eps_clip=None`` disables the clip."""
    lm = loss_mask.bool()
    l1 = (value - target_value).square()
    if value_eps_clip is None:
        loss = l1
        clip_mask = torch.zeros_like(lm)
    else:
        vc = old_value + (value - old_value).clamp(-value_eps_clip, value_eps_clip)
        l2 = (vc - target_value).square()
        loss = torch.maximum(l1, l2)
        clip_mask = (l2.detach() > l1.detach()) & lm
    loss = torch.where(lm, 0.5 * loss, 0.0)
    return loss.sum() / lm.sum().clamp_min(1), {"loss": loss.detach(), "clip_mask": clip_mask}
