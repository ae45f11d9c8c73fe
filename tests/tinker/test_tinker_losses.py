"""Tinker's built-in losses against a slow per-token loop of their documented formulas, and
the checks on their inputs and config."""

from __future__ import annotations

import math

import pytest
import torch

from arealite.tinker.losses import CONFIG_DEFAULTS, LOSSES, LossInputError, resolve


def _slow(name: str, logp: list[float], q: list[float], adv: list[float], w: list[float],
          cfg: dict[str, float]) -> float:
    total = 0.0
    for lp, qq, a, ww in zip(logp, q, adv, w):
        r = math.exp(lp - qq)
        if name == "cross_entropy":
            total += -ww * lp
        elif name == "importance_sampling":
            total += -r * a
        elif name == "ppo":
            clipped = min(max(r, cfg["clip_low_threshold"]), cfg["clip_high_threshold"])
            total += -min(r * a, clipped * a)
        elif name == "cispo":
            clipped = min(max(r, cfg["clip_low_threshold"]), cfg["clip_high_threshold"])
            total += -clipped * lp * a
        elif name == "dro":
            total += -(lp * a - 0.5 * cfg["beta"] * (lp - qq) ** 2)
    return total


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_loss_matches_slow_loop(name):
    g = torch.Generator().manual_seed(0)
    n = 23
    logp = -torch.rand(n, generator=g, dtype=torch.float64) * 3
    q = logp + torch.randn(n, generator=g, dtype=torch.float64) * 0.5  # ratios off both clips
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    w = (torch.rand(n, generator=g, dtype=torch.float64) > 0.3).double()
    cfg = {**CONFIG_DEFAULTS[name], **({"beta": 0.3} if name == "dro" else {})}
    inputs = {"logprobs": q, "advantages": adv, "weights": w}
    got = float(LOSSES[name](logp, inputs, cfg))
    want = _slow(name, logp.tolist(), q.tolist(), adv.tolist(), w.tolist(), cfg)
    assert got == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_cispo_detaches_the_ratio():
    """CISPO's gradient is ``-clip(r) A`` per token: the ratio carries no gradient."""
    logp = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64, requires_grad=True)
    q = torch.tensor([-1.5, -1.0, -0.5], dtype=torch.float64)
    adv = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    LOSSES["cispo"](logp, {"logprobs": q, "advantages": adv}, CONFIG_DEFAULTS["cispo"]).backward()
    r = torch.exp(logp.detach() - q).clamp(0.8, 1.2)
    assert torch.allclose(logp.grad, -r * adv)


def test_resolve_checks_inputs_and_config():
    assert resolve("ppo", None, {"target_tokens", "logprobs", "advantages"}) == {
        "clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
    assert resolve("dro", {"beta": 0.1}, {"logprobs", "advantages"})["beta"] == 0.1
    with pytest.raises(LossInputError, match="unknown loss_fn"):
        resolve("nope", None, set())
    with pytest.raises(LossInputError, match="advantages"):
        resolve("importance_sampling", None, {"logprobs"})
    with pytest.raises(LossInputError, match="unknown keys"):
        resolve("cross_entropy", {"beta": 1.0}, set())
    with pytest.raises(LossInputError, match="clip_low_threshold"):
        resolve("ppo", {"clip_low_threshold": 1.5}, {"logprobs", "advantages"})
