"""Every function of arealite.engine.ppo.advantages against a slow, obviously-correct loop."""

from __future__ import annotations

import math

import pytest
import torch

from arealite.engine.ppo import advantages as A
from tests.support.random_batch import TOL, rand_batch


def test_reward_transform_matches_loop():
    r = torch.tensor([-30.0, -1.0, 0.0, 2.5, 40.0])
    got = A.reward_transform(r, reward_bias=-0.5, reward_scaling=2.0, reward_clip=10.0)
    for i, v in enumerate(r.tolist()):
        assert abs(float(got[i]) - max(-10.0, min(10.0, (v - 0.5) * 2.0))) < TOL


@pytest.mark.parametrize("group_size", [1, 2, 3])
def test_group_reward_normalization_matches_loop(group_size):
    g = torch.Generator().manual_seed(group_size)
    r = torch.randn(6, generator=g)
    r[:group_size] = 1.0  # an all-equal group normalises to 0, not NaN
    got = A.group_normalization(r, group_size, eps=1e-6)
    for s in range(0, 6, group_size):
        grp = r[s : s + group_size].tolist()
        mean = sum(grp) / len(grp)
        std = math.sqrt(sum((v - mean) ** 2 for v in grp) / len(grp))
        for k, v in enumerate(grp):
            assert abs(float(got[s + k]) - (v - mean) / (std + 1e-6)) < 1e-5
    assert torch.isfinite(got).all()


def test_group_advantage_normalization_over_tokens_matches_loop():
    g, _, lm = rand_batch(3, B=6)
    adv = torch.randn(lm.shape, generator=g)
    gs = 3
    got = A.group_normalization(adv, gs, mask=lm, eps=1e-6)
    for s in range(0, 6, gs):  # group s covers rows s .. s+gs-1 (not s*gs: AReaL's slicing bug)
        vals = [float(adv[i, j]) for i in range(s, s + gs) for j in range(lm.shape[1]) if lm[i, j]]
        mean = sum(vals) / len(vals)
        std = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))
        for i in range(s, s + gs):
            for j in range(lm.shape[1]):
                ref = (float(adv[i, j]) - mean) / (std + 1e-6) if lm[i, j] else 0.0
                assert abs(float(got[i, j]) - ref) < 1e-5


def test_group_normalization_rejects_partial_groups():
    with pytest.raises(ValueError, match="groups"):
        A.group_normalization(torch.zeros(5), 2)


# ----------------------------------------------------------------------------- advantages


def _ref_gae(r, v, lm, gamma, lam):
    B, S = lm.shape
    adv = [[0.0] * S for _ in range(B)]
    ret = [[0.0] * S for _ in range(B)]
    for b in range(B):
        steps = [t for t in range(S) if lm[b, t]]
        gae, nv = 0.0, 0.0
        for t in reversed(steps):
            delta = float(r[b, t]) + gamma * nv - float(v[b, t])
            gae = delta + gamma * lam * gae
            adv[b][t] = gae
            ret[b][t] = gae + float(v[b, t])
            nv = float(v[b, t])
    return torch.tensor(adv), torch.tensor(ret)


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.9, 0.95), (0.5, 0.0)])
def test_gae_matches_loop(gamma, lam):
    g, _, lm = rand_batch(4)
    lm[2, 4] = False  # a hole (e.g. tool feedback) inside the generated span
    r = torch.randn(lm.shape, generator=g)
    v = torch.randn(lm.shape, generator=g)
    adv, ret = A.gae_advantages(r, v, lm, gamma, lam)
    ref_adv, ref_ret = _ref_gae(r, v, lm, gamma, lam)
    assert torch.allclose(adv, ref_adv, atol=1e-5) and torch.allclose(ret, ref_ret, atol=1e-5)
    adv0, _ = A.gae_advantages(r, None, lm, gamma, lam)
    assert torch.allclose(adv0, _ref_gae(r, torch.zeros_like(v), lm, gamma, lam)[0], atol=1e-5)


def test_kl_shaped_rewards_match_loop():
    g, _, lm = rand_batch(5)
    lp = -torch.rand(lm.shape, generator=g)
    ref_lp = -torch.rand(lm.shape, generator=g)
    rewards = torch.randn(lm.shape[0], generator=g)
    tok, kl = A.kl_shaped_token_rewards(rewards, lp, ref_lp, lm, kl_ctl=0.1)
    for b in range(lm.shape[0]):
        steps = [t for t in range(lm.shape[1]) if lm[b, t]]
        for t in range(lm.shape[1]):
            k = float(lp[b, t] - ref_lp[b, t]) if lm[b, t] else 0.0
            want = -0.1 * k + (float(rewards[b]) if steps and t == steps[-1] else 0.0)
            assert abs(float(tok[b, t]) - want) < TOL and abs(float(kl[b, t]) - k) < TOL


# ----------------------------------------------------------------------------- losses
