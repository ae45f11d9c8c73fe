"""Every advantage estimator of arealite.engine.ppo.estimators against a slow loop written from
its paper's formula, on random rewards, KL, masks and uneven lengths."""

from __future__ import annotations

import math

import pytest
import torch

from arealite.api.config.actor import PPOActorConfig
from arealite.engine.ppo import estimators as E
from tests.engine.ppo.test_advantages import _ref_gae
from tests.support.random_batch import TOL, rand_batch

G = 4  # group size
B = 12


def _inputs(seed: int, kl_ctl: float, **cfg) -> E.AdvantageInputs:
    g, am, lm = rand_batch(seed, B=B, S=10)
    rewards = torch.randn(B, generator=g)
    rewards[G : 2 * G] = 0.5  # an all-equal group
    rewards[2 * G] = 3.0
    kl = torch.where(lm, 0.3 * torch.randn(B, 10, generator=g), 0.0)
    c = PPOActorConfig(group_size=G, kl_ctl=kl_ctl, **cfg)
    return E.AdvantageInputs(rewards, kl, lm, None, c)


def _ref_reward_to_go(shaped, kl, lm, kl_ctl, gamma=1.0):
    """adv_t = Σ_{t' >= t generated} gamma^(k) tok_t', tok = -kl_ctl kl (+ reward on the last)."""
    out = [[0.0] * lm.shape[1] for _ in range(lm.shape[0])]
    for b in range(lm.shape[0]):
        idx = [t for t in range(lm.shape[1]) if lm[b, t]]
        acc = 0.0
        for j, t in enumerate(reversed(idx)):
            tok = -kl_ctl * float(kl[b, t]) + (float(shaped[b]) if j == 0 else 0.0)
            acc = tok + gamma * acc
            out[b][t] = acc
    return out


def _ref_batch_norm(vals, lm, eps=1e-5):
    xs = [vals[b][t] for b in range(lm.shape[0]) for t in range(lm.shape[1]) if lm[b, t]]
    mean = sum(xs) / len(xs)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))
    return [[(v - mean) / (std + eps) if lm[b, t] else 0.0 for t, v in enumerate(row)]
            for b, row in enumerate(vals)]


def _ref_baseline(name, r):
    out = []
    for s in range(0, len(r), G):
        grp = [float(x) for x in r[s : s + G]]
        mean = sum(grp) / G
        std = math.sqrt(sum((x - mean) ** 2 for x in grp) / G)
        for i, x in enumerate(grp):
            if name == "grpo":
                out.append((x - mean) / (std + 1e-6))
            elif name in ("dr_grpo", "reinforce_pp_baseline"):
                out.append(x - mean)
            elif name == "rloo":
                out.append(x - (sum(grp) - grp[i]) / (G - 1))
            else:
                out.append(x)
    return out


def _close(got: torch.Tensor, ref) -> None:
    for b, row in enumerate(ref):
        for t, v in enumerate(row):
            assert abs(float(got[b, t]) - v) < TOL, (b, t, float(got[b, t]), v)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "reinforce_pp",
                                  "reinforce_pp_baseline"])
@pytest.mark.parametrize("kl_ctl", [0.0, 0.1])
def test_estimator_matches_paper_loop(name, kl_ctl):
    inp = _inputs(11, kl_ctl, discount=0.9 if name == "reinforce_pp" else 1.0)
    out = E.ADVANTAGE_ESTIMATORS[name](inp)
    shaped = _ref_baseline(name, inp.rewards)
    assert all(abs(float(out.shaped_rewards[i]) - v) < TOL for i, v in enumerate(shaped))
    gamma = inp.config.discount if name.startswith("reinforce_pp") else 1.0
    ref = _ref_reward_to_go(shaped, inp.kl, inp.loss_mask, kl_ctl, gamma)
    _close(out.returns, ref)
    if name.startswith("reinforce_pp"):
        ref = _ref_batch_norm(ref, inp.loss_mask)
    _close(out.advantages, ref)
    lm = inp.loss_mask
    assert not out.advantages[~lm].any() and not out.advantages[0].any()  # row 0: no tokens
    if name in ("grpo", "dr_grpo", "rloo") and kl_ctl == 0:
        assert not out.advantages[G : 2 * G].any()  # all-equal group: no signal


def test_gae_estimator_is_the_configured_pipeline():
    g, am, lm = rand_batch(3, B=8, S=9)
    r = torch.randn(8, generator=g)
    kl = torch.where(lm, 0.2 * torch.randn(8, 9, generator=g), 0.0)
    v = torch.randn(8, 9, generator=g)
    c = PPOActorConfig(group_size=2, group_reward_norm=True, adv_norm=True, kl_ctl=0.05,
                       discount=0.95, gae_lambda=0.9)
    out = E.gae(E.AdvantageInputs(r, kl, lm, v, c))
    shaped = []
    for s in range(0, 8, 2):
        a, b = float(r[s]), float(r[s + 1])
        mean, std = (a + b) / 2, abs(a - b) / 2
        shaped += [(a - mean) / (std + 1e-6), (b - mean) / (std + 1e-6)]
    tok = torch.where(lm, -0.05 * kl, 0.0)
    for b in range(8):
        idx = torch.nonzero(lm[b]).flatten()
        if len(idx):
            tok[b, idx[-1]] += shaped[b]
    adv, _ = _ref_gae(tok, v, lm, 0.95, 0.9)
    _close(out.advantages, _ref_batch_norm(adv, lm))


def test_rloo_group_of_one_has_no_baseline_signal():
    r = torch.tensor([1.0, -2.0])
    assert torch.equal(E.leave_one_out_baseline(r, 1), torch.zeros(2))


@pytest.mark.parametrize("buffer", [1, 4, 10])
def test_overlong_penalty_matches_dapo_formula(buffer):
    L, f = 10, 0.7
    lens = torch.arange(0, 14)
    got = E.overlong_penalty(lens, L, buffer, f)
    for n in lens.tolist():
        if n <= L - buffer:
            ref = 0.0
        elif n <= L:
            ref = f * ((L - buffer) - n) / buffer
        else:
            ref = -f
        assert abs(float(got[n]) - ref) < TOL


def test_overlong_penalty_rejects_bad_buffer():
    with pytest.raises(ValueError, match="overlong buffer"):
        E.overlong_penalty(torch.tensor([3]), 4, 5)


def test_config_rejects_group_norm_flags_outside_gae():
    with pytest.raises(ValueError, match="belong to adv_estimator=gae"):
        PPOActorConfig(adv_estimator="rloo", group_reward_norm=True)


def test_actor_adds_the_overlong_penalty_before_the_estimator():
    from arealite.engine.ppo.actor import PPOActor

    g, am, lm = rand_batch(8, B=4, S=10)
    d = {"input_ids": torch.ones(4, 10, dtype=torch.long), "attention_mask": am, "loss_mask": lm,
         "rewards": torch.tensor([1.0, 0.0, 1.0, 0.0]), "logprobs": torch.zeros(4, 10)}
    c = PPOActorConfig(group_size=2, adv_estimator="dr_grpo", recompute_logprob=False,
                       use_decoupled_loss=False, overlong_max_len=6, overlong_buffer_len=3,
                       overlong_penalty_factor=0.5)
    PPOActor(c, None).compute_advantages(d)
    n = lm.sum(1).tolist()
    r = [float(d_) + float(E.overlong_penalty(torch.tensor([k]), 6, 3, 0.5)) for d_, k in
         zip([1.0, 0.0, 1.0, 0.0], n)]
    want = [r[0] - (r[0] + r[1]) / 2, r[1] - (r[0] + r[1]) / 2,
            r[2] - (r[2] + r[3]) / 2, r[3] - (r[2] + r[3]) / 2]
    assert any(k > 3 for k in n)  # some sample is inside the penalty ramp
    for i in range(4):
        assert abs(float(d["shaped_rewards"][i]) - want[i]) < TOL
