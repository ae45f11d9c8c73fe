"""The consistency gate's arithmetic against a slow loop over positions, and its judgement."""

from __future__ import annotations

import math

import pytest
import torch

from arealite.api.config.weights import ConsistencyGateConfig
from arealite.weights.consistency import TAIL_FLOOR, gate_figures, topk_tail_kl
from arealite.weights.consistency_gate import judge, parse_answer


def _reference(server_lp, server_ids, trainer_lp, trainer_argmax):
    """One position at a time, with Python floats."""
    kls, tails, gaps, differ = [], [], [], 0
    for i in range(len(server_lp)):
        p = [math.exp(x) for x in server_lp[i].tolist()]
        q = [math.exp(x) for x in trainer_lp[i].tolist()]
        p_tail, q_tail = max(1 - sum(p), TAIL_FLOOR), max(1 - sum(q), TAIL_FLOOR)
        kl = sum(pi * (math.log(pi) - math.log(qi)) for pi, qi in zip(p, q))
        kl += p_tail * (math.log(p_tail) - math.log(q_tail))
        kls.append(max(kl, 0.0))
        tails.append(p_tail)
        gaps.extend(abs(a - b) for a, b in zip(server_lp[i].tolist(), trainer_lp[i].tolist()))
        differ += int(server_ids[i, 0]) != int(trainer_argmax[i])
    n = len(server_lp)
    return {
        "kl_mean": sum(kls) / n,
        "kl_max": max(kls),
        "tail_mass": sum(tails) / n,
        "max_logprob_gap": max(gaps),
        "argmax_mismatch": differ / n,
        "positions": float(n),
    }


def _distributions(n: int, vocab: int, k: int, noise: float, seed: int):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, vocab, generator=g, dtype=torch.float64) * 2
    server = torch.log_softmax(logits, -1)
    trainer = torch.log_softmax(
        logits + noise * torch.randn(n, vocab, generator=g, dtype=torch.float64), -1
    )
    s_lp, s_ids = server.topk(k, -1)
    return s_lp, s_ids, trainer.gather(-1, s_ids), trainer.argmax(-1), server, trainer


@pytest.mark.parametrize("noise,k", [(0.0, 4), (0.05, 4), (0.5, 8), (2.0, 3)])
def test_figures_match_the_slow_loop(noise, k):
    s_lp, s_ids, t_lp, t_arg, _, _ = _distributions(40, 50, k, noise, seed=k)
    got = gate_figures(s_lp, s_ids, t_lp, t_arg)
    want = _reference(s_lp, s_ids, t_lp, t_arg)
    assert got.keys() == want.keys()
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-9, abs=1e-12), key
    if noise == 0.0:
        assert (
            got["kl_max"] == 0.0 and got["max_logprob_gap"] == 0.0 and got["argmax_mismatch"] == 0.0
        )
    else:
        assert got["kl_mean"] > 0


def test_topk_plus_tail_kl_is_a_lower_bound_of_the_full_kl():
    # Merging the tail into one outcome can only lose divergence (the data-processing
    # inequality): with k = vocab it is the full KL, with fewer it is at most that.
    s_lp, s_ids, t_lp, _, server, trainer = _distributions(30, 20, 20, 0.3, seed=1)
    full = (server.exp() * (server - trainer)).sum(-1)
    assert torch.allclose(topk_tail_kl(s_lp, t_lp), full, rtol=1e-9, atol=1e-12)
    for k in (1, 5, 12):
        part = topk_tail_kl(s_lp[:, :k], t_lp[:, :k])
        assert (part <= full + 1e-12).all() and (part >= -1e-12).all()


def test_a_difference_only_in_the_tail_is_seen():
    # Same top-k log-probs would read 0 on the head alone; the tail bucket sees the mass moved.
    s = torch.log(torch.tensor([[0.5, 0.3]], dtype=torch.float64))
    t = torch.log(torch.tensor([[0.5, 0.1]], dtype=torch.float64))
    kl = float(topk_tail_kl(s, t)[0])
    want = 0.3 * math.log(0.3 / 0.1) + 0.2 * math.log(0.2 / 0.4)
    assert kl == pytest.approx(want, rel=1e-12)
    assert (
        gate_figures(
            s[:0], torch.zeros(0, 2, dtype=torch.long), t[:0], torch.zeros(0, dtype=torch.long)
        )["positions"]
        == 0.0
    )


def test_judge_reads_each_threshold_and_nan_fails():
    fig = {"kl_mean": 0.01, "argmax_mismatch": 0.3, "max_logprob_gap": 2.0}
    cfg = ConsistencyGateConfig(max_kl=0.02, max_argmax_mismatch=0.25, max_logprob_gap=None)
    assert judge(fig, cfg) == "argmax_mismatch 0.3 > 0.25"
    assert judge({**fig, "argmax_mismatch": 0.0}, cfg) == ""
    assert "kl_mean nan" in judge({**fig, "kl_mean": float("nan")}, cfg)
    assert "max_logprob_gap 2 > 1" in judge(fig, cfg.model_copy(update={"max_logprob_gap": 1.0}))


def test_parse_answer_reads_sglang_top_logprobs_and_refuses_a_short_one():
    item = {
        "output_ids": [5, 6],
        "meta_info": {
            "output_token_logprobs": [[-0.1, 5, None], [None, 6, None]],
            "output_top_logprobs": [
                [[-0.1, 5, None], [-2.5, 9, None]],
                [[-0.7, 7, None], [None, 6, None]],
            ],
        },
    }
    a = parse_answer([1, 2], item, 2)
    assert a.top_ids == [[5, 9], [7, 6]] and a.top_logp[1][1] == float("-inf")
    assert a.sampled_logp == [-0.1, float("-inf")]
    with pytest.raises(ValueError, match="fewer than top_logprobs_num=3"):
        parse_answer([1, 2], item, 3)
    with pytest.raises(ValueError, match="output_top_logprobs"):
        parse_answer([1, 2], {"output_ids": [5], "meta_info": {}}, 2)


def test_a_token_the_server_gives_no_mass_adds_nothing():
    s = torch.tensor([[0.0, float("-inf")]], dtype=torch.float64)
    t = torch.tensor([[-1e-9, float("-inf")]], dtype=torch.float64)
    assert float(topk_tail_kl(s, t)[0]) == pytest.approx(0.0, abs=1e-8)


def test_logit_chunks_read_dense_logits_and_a_fused_head_alike():
    from arealite.weights.consistency_gate import _logit_chunks

    g = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(5, 3, generator=g), torch.randn(7, 3, generator=g)

    class Head:  # the fused LM head's HeadInput: hidden states and weight, logits by chunks
        def chunks(self, temperature):
            for i in range(0, 5, 2):
                yield slice(i, min(i + 2, 5)), (hidden[i : i + 2] @ weight.t()) / temperature

    dense = torch.cat([z for _, z in _logit_chunks(hidden @ weight.t(), 0.5, chunk=3)])
    fused = torch.cat([z for _, z in _logit_chunks(Head(), 0.5)])
    assert torch.allclose(dense, fused) and dense.shape == (5, 7)
