"""Offline preference losses on sequence log-probabilities (DPO, IPO, KTO), plain functions of
``[N]`` tensors, tested against loops in ``tests/engine/preference/test_losses.py``.

``logp`` is a sample's summed completion log-probability under the policy, ``ref`` under the
frozen reference; ``n_tok`` its completion length. Each returns the per-example losses (mean
them for the batch loss) and the implicit rewards ``beta * (logp - ref)``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from arealite.utils.distributed import all_reduce


def dpo_loss(
    logp_chosen: torch.Tensor, logp_rejected: torch.Tensor, ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor, beta: float, loss_type: str = "sigmoid",
    n_tok_chosen: torch.Tensor | None = None, n_tok_rejected: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-pair DPO loss (Rafailov et al. 2023), ``-log σ(β h)`` with
    ``h = (logp_c - ref_c) - (logp_r - ref_r)``; ``loss_type="ipo"`` (Azar et al. 2023) is
    ``(h' - 1/(2β))^2`` with ``h'`` built from per-token (length-averaged) log-ratios.
    Returns (losses, chosen rewards, rejected rewards)."""
    lr_c = logp_chosen - ref_chosen
    lr_r = logp_rejected - ref_rejected
    if loss_type == "sigmoid":
        losses = -F.logsigmoid(beta * (lr_c - lr_r))
    elif loss_type == "ipo":
        if n_tok_chosen is None or n_tok_rejected is None:
            raise ValueError("ipo needs the completion lengths")
        h = lr_c / n_tok_chosen.clamp_min(1) - lr_r / n_tok_rejected.clamp_min(1)
        losses = (h - 1.0 / (2.0 * beta)) ** 2
    else:
        raise ValueError(f"dpo loss_type must be sigmoid or ipo, not {loss_type!r}")
    return losses, beta * lr_c.detach(), beta * lr_r.detach()


def chosen_nll(logp_chosen: torch.Tensor, n_tok_chosen: torch.Tensor) -> torch.Tensor:
    """Token-mean negative log-likelihood of the chosen completions over the batch,
    ``-Σ logp_c / Σ n_tok_c``: the term RPO / iterative RPO (Pang et al. 2024) add to DPO so
    the chosen answers' likelihood does not fall while the margin grows (plain DPO lowers
    both, and with it the greedy accuracy of a task whose wrong answers share tokens with the
    right ones). A scalar."""
    return -logp_chosen.sum() / n_tok_chosen.sum().clamp_min(1)


def kto_loss(
    logp: torch.Tensor, ref: torch.Tensor, desirable: torch.Tensor, kl_ref_point: float,
    beta: float, desirable_weight: float = 1.0, undesirable_weight: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example KTO loss (Ethayarajh et al. 2024) with reference point ``z0``
    (``kl_ref_point``, detached, >= 0): ``λ_D (1 - σ(β (r - z0)))`` for a desirable completion,
    ``λ_U (1 - σ(β (z0 - r)))`` for an undesirable one, ``r = logp - ref``.
    Returns (losses, rewards)."""
    r = logp - ref
    d = desirable.bool()
    losses = torch.where(d, desirable_weight * (1 - torch.sigmoid(beta * (r - kl_ref_point))),
                         undesirable_weight * (1 - torch.sigmoid(beta * (kl_ref_point - r))))
    return losses, beta * r.detach()


def kto_reference_point(logp_mismatched: torch.Tensor, ref_mismatched: torch.Tensor,
                        group: dist.ProcessGroup | None = None,
                        device: torch.device | str | None = None) -> float:
    """KTO's ``z0``: the batch mean of ``logp - ref`` on mismatched (prompt, another row's
    completion) pairs, clamped at 0; a constant (no gradient). With ``group``, the mean is
    over every rank's rows (as TRL gathers it), so all ranks share one ``z0``; ``device``:
    where the all-reduce runs (the engine's, for nccl)."""
    d = (logp_mismatched - ref_mismatched).double()
    t = torch.tensor([float(d.sum()), float(d.numel())], dtype=torch.float64,
                     device=device or d.device)
    all_reduce(t, group=group)
    return max(float(t[0] / t[1].clamp_min(1)), 0.0)


def bradley_terry_loss(
    score_chosen: torch.Tensor, score_rejected: torch.Tensor, margin: torch.Tensor | None = None,
    center_coef: float = 0.0,
) -> torch.Tensor:
    """Per-pair reward-model loss (Bradley–Terry, as in Ouyang et al. 2022):
    ``-log σ(r_c - r_r - m)`` for scalar scores ``r`` of the chosen and rejected completion and
    an optional per-pair ``margin`` ``m``; ``center_coef > 0`` adds ``center_coef · (r_c + r_r)²``,
    which pins the scores' free offset near zero (BT sees only differences)."""
    diff = score_chosen - score_rejected
    if margin is not None:
        diff = diff - margin
    losses = -F.logsigmoid(diff)
    if center_coef:
        losses = losses + center_coef * (score_chosen + score_rejected) ** 2
    return losses
