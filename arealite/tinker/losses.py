"""Tinker's built-in losses, one plain function each, over the tokens of one datum (or of many
datums packed together: every loss is a sum over tokens, so packing does not change it).

Each takes the trainer's log-probabilities of the target tokens (``logp [T]``, with gradients)
and the datum's ``loss_fn_inputs`` as tensors on the same tokens, and returns the summed loss.
Tinker's losses are sums, not means: gradients of successive ``forward_backward`` calls add up
until ``optim_step``. The policy losses that arealite already owns (PPO's clipped surrogate,
CISPO) are arealite's own functions (``arealite.engine.ppo.policy_losses``), summed; Tinker's
ratio bounds ``clip_low_threshold``/``clip_high_threshold`` are arealite's ``1 - eps_clip`` and
``1 + eps_clip_higher``. Each is checked against a slow per-token loop in
``tests/tinker/test_losses.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from arealite.engine.ppo.policy_losses import cispo as arealite_cispo
from arealite.engine.ppo.policy_losses import ppo_clip

LossInputs = Mapping[str, torch.Tensor]

# the loss_fn_inputs each loss needs beside target_tokens (weights is optional for
# cross_entropy: all ones)
REQUIRED_INPUTS: dict[str, tuple[str, ...]] = {
    "cross_entropy": (),
    "importance_sampling": ("logprobs", "advantages"),
    "ppo": ("logprobs", "advantages"),
    "cispo": ("logprobs", "advantages"),
    "dro": ("logprobs", "advantages"),
}
# loss_fn_config keys each loss reads, with Tinker's defaults
CONFIG_DEFAULTS: dict[str, dict[str, float]] = {
    "cross_entropy": {},
    "importance_sampling": {},
    "ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "cispo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
    "dro": {"beta": 0.05},
}


class LossInputError(ValueError):
    """A loss was asked for with inputs or a config it cannot use (a user error)."""


def cross_entropy(logp: torch.Tensor, inputs: LossInputs, config: Mapping[str, float]
                  ) -> torch.Tensor:
    """``-Σ weights * logp`` (weights default to ones)."""
    w = inputs.get("weights")
    return -(logp * w).sum() if w is not None else -logp.sum()


def importance_sampling(logp: torch.Tensor, inputs: LossInputs, config: Mapping[str, float]
                        ) -> torch.Tensor:
    """``-Σ exp(logp - q) * A``: REINFORCE with the sampler's log-probs ``q`` corrected."""
    ratio = torch.exp(logp - inputs["logprobs"])
    return -(ratio * inputs["advantages"]).sum()


def _all_tokens(logp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """arealite's policy losses take a loss mask and sequence ids: here every token counts
    and the sum does not need the sequences."""
    return (torch.ones_like(logp, dtype=torch.bool),
            torch.zeros_like(logp, dtype=torch.long), 1)


def ppo(logp: torch.Tensor, inputs: LossInputs, config: Mapping[str, float]) -> torch.Tensor:
    """``-Σ min(r A, clip(r, lo, hi) A)``, ``r = exp(logp - q)``: arealite's ``ppo_clip``."""
    lm, seq, n = _all_tokens(logp)
    lo, hi = config["clip_low_threshold"], config["clip_high_threshold"]
    loss, _ = ppo_clip(logp, inputs["logprobs"], inputs["advantages"], lm, seq, n,
                       eps_clip=1.0 - lo, eps_clip_higher=hi - 1.0)
    return loss.sum()


def cispo(logp: torch.Tensor, inputs: LossInputs, config: Mapping[str, float]) -> torch.Tensor:
    """``-Σ sg(clip(r, lo, hi)) A logp``: arealite's ``cispo``."""
    lm, seq, n = _all_tokens(logp)
    lo, hi = config["clip_low_threshold"], config["clip_high_threshold"]
    loss, _ = arealite_cispo(logp, inputs["logprobs"], inputs["advantages"], lm, seq, n,
                             eps_clip=1.0 - lo, eps_clip_higher=hi - 1.0)
    return loss.sum()


def dro(logp: torch.Tensor, inputs: LossInputs, config: Mapping[str, float]) -> torch.Tensor:
    """``-Σ (logp A - beta/2 (logp - q)^2)``: a quadratic pull towards the sampler."""
    q, adv = inputs["logprobs"], inputs["advantages"]
    return -(logp * adv - 0.5 * config["beta"] * (logp - q) ** 2).sum()


LOSSES: dict[str, Callable[[torch.Tensor, LossInputs, Mapping[str, float]], torch.Tensor]] = {
    "cross_entropy": cross_entropy,
    "importance_sampling": importance_sampling,
    "ppo": ppo,
    "cispo": cispo,
    "dro": dro,
}


def resolve(loss_fn: str, config: Mapping[str, float] | None, keys: set[str]
            ) -> dict[str, float]:
    """The loss's full config (Tinker's defaults filled in), after checking the loss exists,
    its config names only keys it reads, and every datum carries the inputs it needs."""
    if loss_fn not in LOSSES:
        raise LossInputError(f"unknown loss_fn {loss_fn!r}: this server has "
                             f"{', '.join(sorted(LOSSES))}")
    defaults = CONFIG_DEFAULTS[loss_fn]
    unknown = sorted(set(config or {}) - set(defaults))
    if unknown:
        raise LossInputError(f"loss_fn_config for {loss_fn} has unknown keys {unknown}; it reads "
                             f"{sorted(defaults) or 'none'}")
    missing = [k for k in REQUIRED_INPUTS[loss_fn] if k not in keys]
    if missing:
        raise LossInputError(f"{loss_fn} needs loss_fn_inputs {missing}")
    out = {**defaults, **{k: float(v) for k, v in (config or {}).items()}}
    if loss_fn in ("ppo", "cispo") and not out["clip_low_threshold"] <= 1.0 <= out["clip_high_threshold"]:
        raise LossInputError("clip_low_threshold <= 1 <= clip_high_threshold is required")
    return out
