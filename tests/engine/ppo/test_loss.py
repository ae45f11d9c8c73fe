"""The PPO losses of arealite.engine.ppo.loss against a slow, obviously-correct loop."""

from __future__ import annotations

import math

import pytest
import torch

from arealite.engine.ppo import loss as L
from tests.support.random_batch import TOL


def _ref_actor_loss(lp, prox, old, adv, lm, eps, eps_hi, c_clip, cap, mode):
    total, n = 0.0, 0
    for i in range(lp.numel()):
        if not lm[i]:
            continue
        n += 1
        base = float(old[i]) if prox is None else float(prox[i])
        ratio = math.exp(float(lp[i]) - base)
        a = float(adv[i])
        clipped = min(max(ratio, 1 - eps), 1 + eps_hi)
        loss = max(-a * ratio, -a * clipped)
        if c_clip is not None and a < 0:
            loss = min(loss, -c_clip * a)
        if prox is not None:
            w = math.exp(float(prox[i]) - float(old[i]))
            if cap is not None:
                if mode == "mask":
                    w = w if w <= cap else 0.0
                else:
                    w = min(w, cap)
            loss *= w
        total += loss
    return total / max(n, 1)


@pytest.mark.parametrize(
    "decoupled,eps_hi,c_clip,cap,mode",
    [
        (True, None, None, None, "mask"),
        (True, 0.28, 3.0, 1.5, "mask"),
        (True, None, 2.0, 1.2, "truncate"),
        (False, 0.3, 3.0, None, "mask"),
    ],
)
def test_ppo_actor_loss_matches_loop(decoupled, eps_hi, c_clip, cap, mode):
    g = torch.Generator().manual_seed(7)
    N = 200
    old = -torch.rand(N, generator=g) * 3
    prox = old + 0.5 * torch.randn(N, generator=g)
    lp = prox + torch.randn(N, generator=g)
    adv = torch.randn(N, generator=g) * 2
    lm = torch.rand(N, generator=g) > 0.3
    lp_t = lp.clone().requires_grad_(True)
    loss, stats = L.ppo_actor_loss_fn(
        lp_t, prox if decoupled else None, old, adv, 0.2, lm, c_clip=c_clip,
        behav_imp_weight_cap=cap, eps_clip_higher=eps_hi, behav_imp_weight_mode=mode,
    )
    ref = _ref_actor_loss(lp, prox if decoupled else None, old, adv, lm, 0.2,
                          0.2 if eps_hi is None else eps_hi, c_clip, cap, mode)
    assert abs(float(loss.detach()) - ref) < TOL
    if c_clip is not None:
        assert stats["dual_clip_mask"].any()
    assert stats["clip_mask"].any()
    # gradient against a finite difference of the reference, on a few coordinates
    loss.backward()
    for i in [int(j) for j in torch.nonzero(lm)[:5, 0]]:
        h = 1e-3
        lp_p, lp_m = lp.clone().double(), lp.clone().double()
        lp_p[i] += h
        lp_m[i] -= h
        args = (prox if decoupled else None, old, adv, lm, 0.2, 0.2 if eps_hi is None else eps_hi,
                c_clip, cap, mode)
        fd = (_ref_actor_loss(lp_p, *args) - _ref_actor_loss(lp_m, *args)) / (2 * h)
        assert abs(float(lp_t.grad[i]) - fd) < 1e-3


def test_step0_invariants_ratio_one_and_plain_policy_gradient():
    """behaviour = proximal = current: ratio 1, approx KL 0, no clipping, and the gradient is
    exactly the policy-gradient one, -A / n_tokens on each token."""
    g = torch.Generator().manual_seed(8)
    N = 64
    lp = -torch.rand(N, generator=g) * 2
    adv = torch.randn(N, generator=g)
    lm = torch.rand(N, generator=g) > 0.2
    x = lp.clone().requires_grad_(True)
    loss, st = L.ppo_actor_loss_fn(x, lp.clone(), lp.clone(), adv, 0.2, lm, c_clip=3.0,
                                   behav_imp_weight_cap=5.0)
    loss.backward()
    assert torch.equal(st["importance_weight"][lm], torch.ones(int(lm.sum())))
    assert float(st["approx_kl"].abs().max()) == 0.0
    assert not st["clip_mask"].any() and not st["dual_clip_mask"].any()
    assert torch.equal(st["behave_imp_weight"][lm], torch.ones(int(lm.sum())))
    pg = torch.where(lm, -adv / lm.sum(), 0.0)
    assert torch.allclose(x.grad, pg, atol=1e-7)
    assert abs(float(loss.detach()) - float((-adv * lm).sum() / lm.sum())) < TOL


def test_ppo_critic_loss_matches_loop():
    g = torch.Generator().manual_seed(9)
    N = 50
    v, ov, tv = (torch.randn(N, generator=g) for _ in range(3))
    lm = torch.rand(N, generator=g) > 0.3
    for eps in (None, 0.2):
        loss, _ = L.ppo_critic_loss_fn(v, ov, tv, eps, lm)
        tot, n = 0.0, 0
        for i in range(N):
            if lm[i]:
                n += 1
                l1 = (float(v[i]) - float(tv[i])) ** 2
                if eps is not None:
                    vc = float(ov[i]) + min(max(float(v[i]) - float(ov[i]), -eps), eps)
                    l1 = max(l1, (vc - float(tv[i])) ** 2)
                tot += 0.5 * l1
        assert abs(float(loss) - tot / n) < TOL
