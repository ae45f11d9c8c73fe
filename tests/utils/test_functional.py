"""Every function of arealite.utils.functional against a slow, obviously-correct loop."""

from __future__ import annotations

import math

import pytest
import torch

from arealite.utils import functional as F

TOL = 1e-6


def _rand_batch(seed: int, B: int = 6, S: int = 9):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(3, S + 1, (B,), generator=g)
    prompt = torch.randint(1, 3, (B,), generator=g)
    am = torch.arange(S)[None] < lens[:, None]
    lm = am & (torch.arange(S)[None] >= prompt[:, None])
    lm[0] = False  # a row with nothing generated
    lm[0, :] = False
    return g, am, lm


# ----------------------------------------------------------------------------- logprobs


@pytest.mark.parametrize("temperature,chunk", [(1.0, 1024), (0.7, 3), (1.3, 1)])
def test_gather_logprobs_matches_loop(temperature, chunk):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(11, 17, generator=g, dtype=torch.float64).float() * 3
    labels = torch.randint(0, 17, (11,), generator=g)
    got = F.gather_logprobs(logits, labels, temperature, chunk_size=chunk)
    got2, ent = F.gather_logprobs_entropy(logits, labels, temperature, chunk_size=chunk)
    for i in range(11):
        z = [float(x) / temperature for x in logits[i]]
        lse = math.log(sum(math.exp(v) for v in z))
        ref = z[int(labels[i])] - lse
        ref_ent = -sum(math.exp(v - lse) * (v - lse) for v in z)
        assert abs(float(got[i]) - ref) < 1e-5 and abs(float(got2[i]) - ref) < 1e-5
        assert abs(float(ent[i]) - ref_ent) < 1e-5


def test_gather_logprobs_gradient_equals_log_softmax():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(7, 13, generator=g, requires_grad=True)
    b = a.detach().clone().requires_grad_(True)
    labels = torch.randint(0, 13, (7,), generator=g)
    F.gather_logprobs(a, labels, 0.9, chunk_size=2).sum().backward()
    torch.log_softmax(b / 0.9, -1).gather(-1, labels[:, None]).sum().backward()
    assert torch.allclose(a.grad, b.grad, atol=TOL)


def test_bad_temperature_is_an_error():
    with pytest.raises(ValueError, match="temperature"):
        F.gather_logprobs(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), 0.0)


# ----------------------------------------------------------------------------- normalisation


def test_masked_normalization_matches_loop():
    g, _, lm = _rand_batch(2)
    x = torch.randn(lm.shape, generator=g)
    for unbiased in (False, True):
        got = F.masked_normalization(x, lm, unbiased=unbiased, eps=1e-5)
        vals = [float(x[i, j]) for i in range(lm.shape[0]) for j in range(lm.shape[1]) if lm[i, j]]
        n = len(vals)
        mean = sum(vals) / n
        var = sum((v - mean) ** 2 for v in vals) / (n - 1 if unbiased else n)
        for i in range(lm.shape[0]):
            for j in range(lm.shape[1]):
                ref = (float(x[i, j]) - mean) / (math.sqrt(var) + 1e-5) if lm[i, j] else 0.0
                assert abs(float(got[i, j]) - ref) < TOL


def test_reward_transform_matches_loop():
    r = torch.tensor([-30.0, -1.0, 0.0, 2.5, 40.0])
    got = F.reward_transform(r, reward_bias=-0.5, reward_scaling=2.0, reward_clip=10.0)
    for i, v in enumerate(r.tolist()):
        assert abs(float(got[i]) - max(-10.0, min(10.0, (v - 0.5) * 2.0))) < TOL


@pytest.mark.parametrize("group_size", [1, 2, 3])
def test_group_reward_normalization_matches_loop(group_size):
    g = torch.Generator().manual_seed(group_size)
    r = torch.randn(6, generator=g)
    r[:group_size] = 1.0  # an all-equal group normalises to 0, not NaN
    got = F.group_normalization(r, group_size, eps=1e-6)
    for s in range(0, 6, group_size):
        grp = r[s : s + group_size].tolist()
        mean = sum(grp) / len(grp)
        std = math.sqrt(sum((v - mean) ** 2 for v in grp) / len(grp))
        for k, v in enumerate(grp):
            assert abs(float(got[s + k]) - (v - mean) / (std + 1e-6)) < 1e-5
    assert torch.isfinite(got).all()


def test_group_advantage_normalization_over_tokens_matches_loop():
    g, _, lm = _rand_batch(3, B=6)
    adv = torch.randn(lm.shape, generator=g)
    gs = 3
    got = F.group_normalization(adv, gs, mask=lm, eps=1e-6)
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
        F.group_normalization(torch.zeros(5), 2)


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
    g, _, lm = _rand_batch(4)
    lm[2, 4] = False  # a hole (e.g. tool feedback) inside the generated span
    r = torch.randn(lm.shape, generator=g)
    v = torch.randn(lm.shape, generator=g)
    adv, ret = F.gae_advantages(r, v, lm, gamma, lam)
    ref_adv, ref_ret = _ref_gae(r, v, lm, gamma, lam)
    assert torch.allclose(adv, ref_adv, atol=1e-5) and torch.allclose(ret, ref_ret, atol=1e-5)
    adv0, _ = F.gae_advantages(r, None, lm, gamma, lam)
    assert torch.allclose(adv0, _ref_gae(r, torch.zeros_like(v), lm, gamma, lam)[0], atol=1e-5)


def test_kl_shaped_rewards_match_loop():
    g, _, lm = _rand_batch(5)
    lp = -torch.rand(lm.shape, generator=g)
    ref_lp = -torch.rand(lm.shape, generator=g)
    rewards = torch.randn(lm.shape[0], generator=g)
    tok, kl = F.kl_shaped_token_rewards(rewards, lp, ref_lp, lm, kl_ctl=0.1)
    for b in range(lm.shape[0]):
        steps = [t for t in range(lm.shape[1]) if lm[b, t]]
        for t in range(lm.shape[1]):
            k = float(lp[b, t] - ref_lp[b, t]) if lm[b, t] else 0.0
            want = -0.1 * k + (float(rewards[b]) if steps and t == steps[-1] else 0.0)
            assert abs(float(tok[b, t]) - want) < TOL and abs(float(kl[b, t]) - k) < TOL


# ----------------------------------------------------------------------------- losses


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
    loss, stats = F.ppo_actor_loss_fn(
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
    loss, st = F.ppo_actor_loss_fn(x, lp.clone(), lp.clone(), adv, 0.2, lm, c_clip=3.0,
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
        loss, _ = F.ppo_critic_loss_fn(v, ov, tv, eps, lm)
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
