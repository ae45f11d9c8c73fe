"""Policy losses and loss aggregations of arealite.engine.ppo.policy_losses against slow loops
written from the papers' formulas, on packed sequences of uneven lengths with masks."""

from __future__ import annotations

import math

import pytest
import torch

from arealite.engine.ppo import policy_losses as P
from tests.support.random_batch import TOL

LENS = [5, 1, 9, 3, 7, 4]


def _packed(seed: int, seq_const_adv: bool = False):
    g = torch.Generator().manual_seed(seed)
    seq_ids = torch.repeat_interleave(torch.arange(len(LENS)), torch.tensor(LENS))
    T = len(seq_ids)
    ref = -torch.rand(T, generator=g) * 3
    lp = ref + 0.15 * torch.randn(T, generator=g)
    lm = torch.rand(T, generator=g) > 0.25
    lm[seq_ids == 1] = False  # a sample with nothing generated
    adv = torch.randn(len(LENS), generator=g)[seq_ids] if seq_const_adv else torch.randn(
        T, generator=g)
    return lp, ref, adv, lm, seq_ids


def _seqs(lm, seq_ids):
    """token indices of each sample's generated tokens"""
    return [[i for i in range(len(lm)) if lm[i] and int(seq_ids[i]) == s]
            for s in range(len(LENS))]


def _surrogate(r, a, eps, hi, c_clip):
    loss = max(-a * r, -a * min(max(r, 1 - eps), 1 + hi))
    if c_clip is not None and a < 0:
        loss = min(loss, -c_clip * a)
    return loss


def _ref_token_losses(name, lp, ref, adv, lm, seq_ids, eps, hi, c_clip):
    """Per-token loss of each sample's generated tokens, by the papers' formulas."""
    out = {}
    for idx in _seqs(lm, seq_ids):
        if name == "gspo":  # s_i = (pi/pi_old (y_i)) ^ (1/|y_i|)
            s = math.exp(sum(float(lp[i]) - float(ref[i]) for i in idx) / max(len(idx), 1))
        for i in idx:
            r = math.exp(float(lp[i]) - float(ref[i]))
            a = float(adv[i])
            if name == "ppo":
                out[i] = _surrogate(r, a, eps, hi, c_clip)
            elif name == "gspo":
                out[i] = _surrogate(s, a, eps, hi, c_clip)
            else:  # cispo: -sg(clip(r)) * A * log pi
                out[i] = -min(max(r, max(1 - eps, 0.0)), 1 + hi) * a * float(lp[i])
    return out


def _ref_aggregate(mode, tok, lm, seq_ids, norm):
    seqs = _seqs(lm, seq_ids)
    if mode == "token_mean":
        return sum(tok.values()) / max(len(tok), 1)
    if mode == "seq_mean_token_mean":
        means = [sum(tok[i] for i in idx) / len(idx) for idx in seqs if idx]
        return sum(means) / max(len(means), 1)
    return sum(tok.values()) / (norm * len(LENS))


@pytest.mark.parametrize("name", ["ppo", "gspo", "cispo"])
@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
@pytest.mark.parametrize("hi,c_clip", [(None, None), (0.28, 1.2)])
def test_policy_loss_and_aggregation_match_paper_loop(name, mode, hi, c_clip):
    if name == "cispo" and c_clip is not None:
        c_clip = None
    lp, ref, adv, lm, seq_ids = _packed(1)
    eps = 0.05 if name == "gspo" else 0.2  # small enough that sequence ratios get clipped
    if name == "gspo" and hi is not None:
        hi = 0.06
    tok, st = P.POLICY_LOSSES[name](lp, ref, adv, lm, seq_ids, len(LENS), eps,
                                    eps_clip_higher=hi, c_clip=c_clip)
    ref_tok = _ref_token_losses(name, lp, ref, adv, lm, seq_ids, eps,
                                eps if hi is None else hi, c_clip)
    for i in range(len(lm)):
        assert abs(float(tok[i]) - ref_tok.get(i, 0.0)) < TOL, i
    agg, weight = P.LOSS_AGGREGATIONS[mode]
    got = agg(tok, lm, seq_ids, len(LENS), 16.0)
    assert abs(float(got) - _ref_aggregate(mode, ref_tok, lm, seq_ids, 16.0)) < TOL
    assert st["clip_mask"].any()
    if c_clip is not None and name == "ppo":
        assert st["dual_clip_mask"].any()


def test_gspo_gradient_is_the_sequence_level_gradient():
    """With one advantage per sample (GRPO), GSPO-token under seq-mean-token-mean has the
    gradient of the paper's sequence objective mean_i max(-A_i s_i, -A_i clip(s_i))."""
    lp, ref, adv, lm, seq_ids = _packed(2, seq_const_adv=True)
    eps = 0.02
    x = lp.clone().double().requires_grad_(True)
    tok, _ = P.gspo(x, ref.double(), adv.double(), lm, seq_ids, len(LENS), eps)
    P.seq_mean_token_mean(tok, lm, seq_ids, len(LENS)).backward()

    def seq_objective(v):
        terms = []
        for idx in _seqs(lm, seq_ids):
            if idx:
                s = math.exp(sum(float(v[i]) - float(ref[i]) for i in idx) / len(idx))
                terms.append(_surrogate(s, float(adv[idx[0]]), eps, eps, None))
        return sum(terms) / len(terms)

    for i in torch.nonzero(lm).flatten().tolist():
        h = 1e-6
        vp, vm = lp.clone().double(), lp.clone().double()
        vp[i] += h
        vm[i] -= h
        fd = (seq_objective(vp) - seq_objective(vm)) / (2 * h)
        assert abs(float(x.grad[i]) - fd) < 1e-6, i


def test_cispo_gradient_keeps_clipped_tokens():
    """d loss / d logp_t = -clip(r_t) A_t / n: clipped tokens still get a gradient."""
    lp, ref, adv, lm, seq_ids = _packed(3)
    lp = ref + 0.5 * torch.randn(len(lp), generator=torch.Generator().manual_seed(0))
    x = lp.clone().double().requires_grad_(True)
    tok, st = P.cispo(x, ref.double(), adv.double(), lm, seq_ids, len(LENS), 0.2, 0.28)
    P.token_mean(tok, lm, seq_ids, len(LENS)).backward()
    n = int(lm.sum())
    for i in range(len(lm)):
        r = math.exp(float(lp[i]) - float(ref[i]))
        want = -min(max(r, 0.8), 1.28) * float(adv[i]) / n if lm[i] else 0.0
        assert abs(float(x.grad[i]) - want) < TOL
    assert (st["clip_mask"] & (x.grad != 0)).any()


def test_aggregation_weights_recombine_micro_batches():
    """train_batch's Σ loss_mb w_mb / Σ w_mb over micro-batches equals the whole-batch value."""
    lp, ref, adv, lm, seq_ids = _packed(4)
    tok, _ = P.ppo_clip(lp, ref, adv, lm, seq_ids, len(LENS), 0.2)
    cut = int((seq_ids < 3).sum())  # micro-batches of samples 0-2 and 3-5
    for mode, (agg, weight) in P.LOSS_AGGREGATIONS.items():
        whole = float(agg(tok, lm, seq_ids, len(LENS), 8.0))
        parts = [(tok[:cut], lm[:cut], seq_ids[:cut], 3), (tok[cut:], lm[cut:], seq_ids[cut:] - 3, 3)]
        num = sum(float(agg(t, m, s, n, 8.0)) * weight(m, s, n) for t, m, s, n in parts)
        den = sum(weight(m, s, n) for _, m, s, n in parts)
        assert abs(num / den - whole) < TOL, mode


def test_packed_seq_ids():
    ids, n = P.packed_seq_ids(torch.tensor([0, 2, 2, 5], dtype=torch.int32))
    assert n == 3 and ids.tolist() == [0, 0, 2, 2, 2]


def test_sum_norm_needs_its_constant():
    with pytest.raises(ValueError, match="loss_agg_norm"):
        P.seq_mean_token_sum_norm(torch.zeros(3), torch.ones(3, dtype=torch.bool),
                                  torch.zeros(3, dtype=torch.long), 1)
