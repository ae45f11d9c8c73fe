"""Train–inference mismatch corrections: the detached behaviour importance weight of the
decoupled loss, separate from the policy loss and combinable with any of them.

The weight compares the proximal policy (recomputed by the trainer) with the behaviour policy
(the logprobs the servers sampled with): ``w_t = exp(prox_t - behave_t)``. Its config values
(``PPOActorConfig``):

- ``behav_imp_weight_level``: ``token`` (``w_t``), ``sequence`` (the product over the sample's
  generated tokens, ``exp(Σ_t (prox_t - behave_t))``, given to each of its tokens) or
  ``geometric`` (the length-normalised product ``exp(mean_t (prox_t - behave_t))``);
- ``behav_imp_weight_mode``: ``truncate`` (truncated IS: ``min(w, cap)``) or ``mask`` (masked
  IS: weight 0 where ``w > cap`` or ``w < floor``; with both bounds it is IcePop's two-sided
  mask). Masked tokens stay in the loss's denominator.

With no bound the weight is the plain decoupled-PPO weight. Formulas: ``docs/algorithms.md``.
Tensors are packed ``[T]`` with ``seq_ids [T]`` (the sample of each token), or any shape with
``seq_ids`` of the same shape.
"""

from __future__ import annotations

import torch


def segment_sum(x: torch.Tensor, seq_ids: torch.Tensor, n_seqs: int) -> torch.Tensor:
    """``out[s] = Σ_{i: seq_ids[i] = s} x[i]`` (float64 for exact sums)."""
    out = torch.zeros(n_seqs, dtype=torch.float64, device=x.device)
    return out.index_add_(0, seq_ids.reshape(-1).long(), x.reshape(-1).double())


def behaviour_correction(
    proximal_logprobs: torch.Tensor,
    behave_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    seq_ids: torch.Tensor,
    n_seqs: int,
    level: str = "token",
    mode: str = "mask",
    cap: float | None = None,
    floor: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The detached per-token behaviour weight (0 off the mask) and per-token stats:
    ``behave_imp_weight`` (the weight applied), ``behave_approx_kl`` (``prox - behave`` on
    kept tokens), ``behave_mask`` (kept tokens), ``behave_truncated`` (tokens whose weight was
    truncated), ``mismatch_kl`` (k3 estimate of KL(behave || prox), every masked token)."""
    lm = loss_mask.bool()
    log_w = torch.where(lm, (proximal_logprobs - behave_logprobs).detach().float(), 0.0)
    if level == "token":
        lw = log_w
    elif level in ("sequence", "geometric"):
        tot = segment_sum(log_w, seq_ids, n_seqs)
        if level == "geometric":
            tot = tot / segment_sum(lm.float(), seq_ids, n_seqs).clamp_min(1)
        lw = tot[seq_ids.long()].float().reshape(log_w.shape)
    else:
        raise ValueError(f"behav_imp_weight_level must be token, sequence or geometric, "
                         f"not {level!r}")
    w = lw.exp()
    keep = lm
    truncated = torch.zeros_like(lm)
    if mode == "mask":
        if cap is not None:
            keep = keep & (w <= cap)
        if floor is not None:
            keep = keep & (w >= floor)
    elif mode == "truncate":
        if floor is not None:
            raise ValueError("behav_imp_weight_floor is a mask bound: use mode=mask (IcePop)")
        if cap is not None:
            truncated = lm & (w > cap)
            w = w.clamp(max=cap)
    else:
        raise ValueError(f"behav_imp_weight_mode must be mask or truncate, not {mode!r}")
    w = torch.where(keep, w, 0.0)
    # k3 = (r - 1) - log r with r = behave/prox: an unbiased, non-negative KL(behave||prox)
    r = torch.exp(-log_w)
    mismatch = torch.where(lm, (r - 1.0) - (-log_w), 0.0)
    return w, {
        "behave_imp_weight": w,
        "behave_approx_kl": torch.where(keep, log_w, 0.0),
        "behave_mask": keep,
        "behave_truncated": truncated,
        "mismatch_kl": mismatch,
    }
