"""Policy losses and loss aggregations, one function each, picked by ``PPOActorConfig``'s
``policy_loss`` and ``loss_agg_mode``.

A policy loss maps the current logprobs (with gradients), the detached reference logprobs of its
ratio (the proximal policy under the decoupled loss, else the old one) and the advantages to a
*per-token* loss and per-token stats; the behaviour correction
(``arealite.engine.ppo.corrections``) multiplies it afterwards and the aggregation reduces it.
Every function takes packed ``[T]`` tensors plus ``seq_ids [T]`` (sample index of each token)
and ``n_seqs``. Formulas and which to pick: ``docs/algorithms.md``; each is tested against a slow
loop in ``tests/engine/ppo/test_policy_losses.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from arealite.engine.ppo.corrections import segment_sum

TokenLoss = tuple[torch.Tensor, dict[str, torch.Tensor]]


def ppo_clip(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, advantages: torch.Tensor,
             loss_mask: torch.Tensor, seq_ids: torch.Tensor, n_seqs: int, eps_clip: float,
             eps_clip_higher: float | None = None, c_clip: float | None = None) -> TokenLoss:
    """PPO's clipped surrogate per token, ``max(-A r, -A clip(r, 1 - eps, 1 + eps_high))`` with
    ``r = exp(logp - ref)``; with ``c_clip`` a negative advantage's loss is bounded by
    ``c_clip |A|`` (dual clip)."""
    lm = loss_mask.bool()
    ratio = torch.where(lm, torch.exp(logprobs - ref_logprobs.detach()), 0.0)
    return _clipped_surrogate(ratio, advantages, lm, eps_clip, eps_clip_higher, c_clip,
                              approx_kl=(logprobs - ref_logprobs).detach())


def _clipped_surrogate(ratio, advantages, lm, eps_clip, eps_clip_higher, c_clip, approx_kl
                       ) -> TokenLoss:
    hi = eps_clip if eps_clip_higher is None else eps_clip_higher
    loss1 = -advantages * ratio
    loss2 = -advantages * ratio.clamp(1.0 - eps_clip, 1.0 + hi)
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
    return torch.where(lm, loss, 0.0), {
        "importance_weight": ratio.detach(),
        "approx_kl": torch.where(lm, approx_kl, 0.0),
        "clip_mask": clip_mask,
        "dual_clip_mask": dual_mask,
    }


def gspo(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, advantages: torch.Tensor,
         loss_mask: torch.Tensor, seq_ids: torch.Tensor, n_seqs: int, eps_clip: float,
         eps_clip_higher: float | None = None, c_clip: float | None = None) -> TokenLoss:
    """GSPO (Zheng et al. 2025), token form: the sequence ratio
    ``s_i = exp(mean_t (logp - ref))`` (length-normalised), carried by each token as
    ``sg(s_i) * exp(logp_t - sg(logp_t))`` so per-token advantages still apply, then clipped as
    PPO does. Its value equals ``s_i``; with seq-mean-token-mean aggregation the gradient is the
    paper's sequence-level one."""
    lm = loss_mask.bool()
    log_r = torch.where(lm, (logprobs - ref_logprobs).detach().float(), 0.0)
    mean_log = segment_sum(log_r, seq_ids, n_seqs) / segment_sum(lm.float(), seq_ids,
                                                                  n_seqs).clamp_min(1)
    seq_log = mean_log[seq_ids.long()].float().reshape(log_r.shape)
    ratio = torch.exp(seq_log + logprobs - logprobs.detach())
    ratio = torch.where(lm, ratio, 0.0)
    return _clipped_surrogate(ratio, advantages, lm, eps_clip, eps_clip_higher, c_clip,
                              approx_kl=seq_log)


def cispo(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, advantages: torch.Tensor,
          loss_mask: torch.Tensor, seq_ids: torch.Tensor, n_seqs: int, eps_clip: float,
          eps_clip_higher: float | None = None, c_clip: float | None = None) -> TokenLoss:
    """CISPO (MiniMax-M1, 2025): ``-sg(clip(r, 1 - eps, 1 + eps_high)) * A * logp``: the
    importance weight is clipped and detached, so every token keeps a gradient (none is
    dropped by the clip). ``c_clip`` does not apply."""
    lm = loss_mask.bool()
    ratio = torch.where(lm, torch.exp(logprobs - ref_logprobs).detach(), 0.0)
    hi = eps_clip if eps_clip_higher is None else eps_clip_higher
    w = ratio.clamp(max(1.0 - eps_clip, 0.0), 1.0 + hi)
    clip_mask = (w != ratio) & lm
    loss = torch.where(lm, -w * advantages * logprobs, 0.0)
    return loss, {
        "importance_weight": ratio,
        "approx_kl": torch.where(lm, (logprobs - ref_logprobs).detach(), 0.0),
        "clip_mask": clip_mask,
        "dual_clip_mask": torch.zeros_like(lm),
    }


POLICY_LOSSES: dict[str, Callable[..., TokenLoss]] = {
    "ppo": ppo_clip,
    "gspo": gspo,
    "cispo": cispo,
}


# --------------------------------------------------------------------------- aggregation
#
# ``train_batch`` combines micro-batches as Σ_mb loss_mb * weight_mb / Σ_mb weight_mb over all
# ranks, so each aggregation is a (loss, weight) pair whose weighted mean is the formula.


def _seqs_with_tokens(lm: torch.Tensor, seq_ids: torch.Tensor, n_seqs: int) -> torch.Tensor:
    return segment_sum(lm.float(), seq_ids, n_seqs) > 0


def token_mean(loss, lm, seq_ids, n_seqs, norm=None):
    """``Σ_all tokens loss / Σ_all tokens 1`` (weight: tokens)."""
    return loss.sum() / lm.sum().clamp_min(1)


def seq_mean_token_mean(loss, lm, seq_ids, n_seqs, norm=None):
    """Mean over samples of each sample's token mean (weight: samples with a token)."""
    n_tok = segment_sum(lm.float(), seq_ids, n_seqs).float()
    per_seq = torch.zeros(n_seqs, dtype=loss.dtype, device=loss.device)
    per_seq = per_seq.index_add(0, seq_ids.reshape(-1).long(), loss.reshape(-1))
    has = n_tok > 0
    return (per_seq[has] / n_tok[has]).sum() / has.sum().clamp_min(1)


def seq_mean_token_sum_norm(loss, lm, seq_ids, n_seqs, norm=None):
    """Dr.GRPO: ``Σ_all tokens loss / (norm * number of samples)`` (weight: samples)."""
    if not norm:
        raise ValueError("seq_mean_token_sum_norm needs loss_agg_norm (e.g. max_new_tokens)")
    return loss.sum() / (norm * max(n_seqs, 1))


def _token_weight(lm, seq_ids, n_seqs) -> float:
    return float(lm.sum())


def _seq_with_token_weight(lm, seq_ids, n_seqs) -> float:
    return float(_seqs_with_tokens(lm.bool(), seq_ids, n_seqs).sum())


def _seq_weight(lm, seq_ids, n_seqs) -> float:
    return float(n_seqs)


# name -> (micro-batch loss, its weight in the mean over micro-batches and ranks)
LOSS_AGGREGATIONS: dict[str, tuple[Callable[..., torch.Tensor], Callable[..., float]]] = {
    "token_mean": (token_mean, _token_weight),
    "seq_mean_token_mean": (seq_mean_token_mean, _seq_with_token_weight),
    "seq_mean_token_sum_norm": (seq_mean_token_sum_norm, _seq_weight),
}


def packed_seq_ids(cu_seqlens: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Sample index of each packed token from ``cu_seqlens``, and the number of samples."""
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    n = int(lens.numel())
    return torch.repeat_interleave(torch.arange(n, device=cu_seqlens.device), lens), n
