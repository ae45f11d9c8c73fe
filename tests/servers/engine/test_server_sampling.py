"""servers.engine.sampling against slow per-row reference loops."""

from __future__ import annotations

import math

import pytest
import torch

from servers.engine.sampling import (
    BatchSampling,
    apply_penalties,
    filter_mask_sorted,
    hashed_uniform,
    sample,
)


def _batch(b, temps, top_ks, top_ps, min_ps, seeds=None, positions=None, vocab=50):
    seeds = seeds or [None] * b
    return BatchSampling(
        temperatures=torch.tensor(temps, dtype=torch.float32),
        top_ks=torch.tensor([min(k, vocab) for k in top_ks]),
        top_ps=torch.tensor(top_ps, dtype=torch.float32),
        min_ps=torch.tensor(min_ps, dtype=torch.float32),
        seeds=torch.tensor([s or 0 for s in seeds]),
        seeded=torch.tensor([s is not None for s in seeds]),
        positions=torch.tensor(positions or [0] * b),
        all_greedy=all(k == 1 for k in top_ks),
        needs_filter=True,
    )


def _ref_keep(probs: list[float], k: int, p: float, min_p: float) -> set[int]:
    """Slow reference: the token ids SGLang's filter keeps for one row."""
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    keep, before = set(), 0.0
    top = probs[order[0]]
    for rank, i in enumerate(order):
        if rank < k and before <= p and probs[i] >= top * min_p:
            keep.add(i)
        before += probs[i]
    return keep


@pytest.mark.parametrize("k,p,min_p", [(1, 1.0, 0.0), (5, 1.0, 0.0), (50, 0.5, 0.0),
                                       (50, 1.0, 0.2), (7, 0.8, 0.05), (50, 0.01, 0.0)])
def test_filter_mask_matches_reference(k, p, min_p):
    torch.manual_seed(0)
    logits = torch.randn(4, 50) * 2
    probs = logits.softmax(-1)
    sp, order = probs.sort(-1, descending=True)
    drop = filter_mask_sorted(sp, torch.full((4,), k), torch.full((4,), p), torch.full((4,), min_p))
    for r in range(4):
        kept = {int(order[r, j]) for j in range(50) if not drop[r, j]}
        assert kept == _ref_keep(probs[r].tolist(), k, p, min_p)


def test_logprobs_are_prefilter_log_softmax_over_temperature():
    torch.manual_seed(1)
    logits = torch.randn(3, 50)
    batch = _batch(3, [0.7, 1.0, 1.3], [5, 1, 50], [0.9, 1.0, 0.5], [0.0, 0.0, 0.1])
    tokens, tok_lp, full = sample(logits.clone(), batch, torch.Generator().manual_seed(0))
    for r, t in enumerate([0.7, 1.0, 1.3]):
        ref = torch.log_softmax(logits[r] / t, -1)
        assert torch.allclose(full[r], ref, atol=1e-6)
        assert math.isclose(tok_lp[r].item(), ref[tokens[r]].item(), abs_tol=1e-6)
    assert tokens[1] == logits[1].argmax()  # top_k 1 is greedy


def test_samples_only_kept_tokens_and_matches_distribution():
    torch.manual_seed(2)
    logits = torch.randn(1, 20)
    b = 4000
    batch = _batch(b, [1.0] * b, [6] * b, [0.9] * b, [0.0] * b, vocab=20)
    tokens, _, _ = sample(logits.expand(b, -1).clone(), batch, torch.Generator().manual_seed(3))
    probs = logits[0].softmax(-1).tolist()
    keep = _ref_keep(probs, 6, 0.9, 0.0)
    assert set(tokens.tolist()) <= keep
    mass = sum(probs[i] for i in keep)
    for i in keep:  # renormalised over the kept set, within sampling noise
        freq = (tokens == i).float().mean().item()
        assert abs(freq - probs[i] / mass) < 0.035


def test_unfiltered_path_matches_softmax_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    b = 6000
    batch = _batch(b, [0.8] * b, [4] * b, [1.0] * b, [0.0] * b, vocab=4)
    batch.needs_filter = False
    tokens, _, _ = sample(logits.expand(b, -1).clone(), batch, torch.Generator().manual_seed(4))
    ref = (logits[0] / 0.8).softmax(-1)
    for i in range(4):
        assert abs((tokens == i).float().mean().item() - ref[i].item()) < 0.03


def test_seeded_rows_do_not_depend_on_batch_neighbours():
    torch.manual_seed(5)
    logits = torch.randn(5, 30)
    seeds = [11, None, 11, 7, None]
    pos = [3, 3, 3, 3, 3]
    b1 = _batch(5, [1.0] * 5, [30] * 5, [1.0] * 5, [0.0] * 5, seeds=seeds, positions=pos, vocab=30)
    t1, _, _ = sample(logits.clone(), b1, torch.Generator().manual_seed(1))
    b2 = _batch(1, [1.0], [30], [1.0], [0.0], seeds=[11], positions=[3], vocab=30)
    t2, _, _ = sample(logits[2:3].clone(), b2, torch.Generator().manual_seed(99))
    assert t1[2] == t2[0]
    u = hashed_uniform(torch.tensor([11, 11, 12]), torch.tensor([3, 4, 3]), 30)
    assert ((u > 0) & (u < 1)).all()
    assert not torch.equal(u[0], u[1]) and not torch.equal(u[0], u[2])
    assert torch.equal(u[0], hashed_uniform(torch.tensor([11]), torch.tensor([3]), 30)[0])


def test_penalties_match_reference():
    torch.manual_seed(6)
    logits = torch.randn(2, 10)
    out = logits.clone()
    prompt, output = [1, 2], [2, 3, 3]
    apply_penalties(out, [1], [(prompt, output)], [0.5], [0.3], [1.2])
    ref = logits[1].clone()
    for tok in range(10):
        c = output.count(tok)
        ref[tok] -= 0.5 * c + 0.3 * (c > 0)
    for tok in set(prompt + output):
        ref[tok] = ref[tok] / 1.2 if ref[tok] > 0 else ref[tok] * 1.2
    assert torch.allclose(out[1], ref) and torch.equal(out[0], logits[0])
