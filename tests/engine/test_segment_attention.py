"""Segment attention (per-sequence and prefix-tree) against the dense block-causal mask: the
same logits and the same gradients on the tiny model, to float tolerance."""

from __future__ import annotations

import random

import pytest
import torch

from arealite.engine.packing import block_causal_mask
from arealite.engine.prefix_pack import share_prefixes
from arealite.engine.segment_attention import register, sequence_layout

TOL = 2e-5


def _models(path):
    from transformers import AutoModelForCausalLM

    dense = AutoModelForCausalLM.from_pretrained(str(path), attn_implementation="sdpa")
    seg = AutoModelForCausalLM.from_pretrained(str(path), attn_implementation=register())
    return dense, seg


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def _assert_close_grads(a, b):
    for n in a:
        scale = float(a[n].abs().max()) + 1e-6
        assert float((a[n] - b[n]).abs().max()) / scale < TOL, n


def _dense_run(model, ids_rows, weights):
    """Reference: ordinary packing with a dense block-causal mask; returns logits [T, V]."""
    lens = torch.tensor([len(r) for r in ids_rows])
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = lens.cumsum(0)
    ids = torch.tensor([t for r in ids_rows for t in r])[None]
    pos = torch.cat([torch.arange(n) for n in lens.tolist()])[None]
    logits = model(input_ids=ids, attention_mask=block_causal_mask(cu), position_ids=pos,
                   use_cache=False).logits[0]
    (logits * weights).sum().backward()
    return logits, cu


def test_sequence_layout_matches_dense_mask(tiny_model_dir):
    dense, seg = _models(tiny_model_dir)
    rng = random.Random(0)
    rows = [[rng.randint(3, 300) for _ in range(rng.randint(1, 30))] for _ in range(17)]
    T = sum(map(len, rows))
    w = torch.randn(T, dense.config.vocab_size, generator=torch.Generator().manual_seed(1))
    ref, cu = _dense_run(dense, rows, w)
    ids = torch.tensor([t for r in rows for t in r])[None]
    pos = torch.cat([torch.arange(len(r)) for r in rows])[None]
    out = seg(input_ids=ids, position_ids=pos, use_cache=False,
              segment_layout=sequence_layout(cu)).logits[0]
    (out * w).sum().backward()
    assert float((out - ref).detach().abs().max()) < TOL
    _assert_close_grads(_grads(dense), _grads(seg))


@pytest.mark.parametrize("case", ["prompts", "identical", "singletons"])
def test_prefix_tree_matches_unshared_computation(tiny_model_dir, case):
    dense, seg = _models(tiny_model_dir)
    rng = random.Random(3)
    rows, units = [], []
    for g in range(4):
        prompt = [rng.randint(3, 300) for _ in range(rng.randint(1, 12))]
        k = 1 if case == "singletons" else rng.randint(2, 5)
        gens = [[rng.randint(3, 300) for _ in range(rng.randint(0 if i else 1, 6))]
                for i in range(k)]
        if case == "identical":
            gens = [gens[0]] * k
        for gen in gens:
            rows.append(prompt + gen)
            units.append(g)
    T = sum(map(len, rows))
    w = torch.randn(T, dense.config.vocab_size, generator=torch.Generator().manual_seed(2))
    ref, _ = _dense_run(dense, rows, w)
    S = max(map(len, rows))
    padded = torch.zeros(len(rows), S, dtype=torch.long)
    for i, r in enumerate(rows):
        padded[i, : len(r)] = torch.tensor(r)
    lens = torch.tensor([len(r) for r in rows])
    ids, pos, expand, layout = share_prefixes(padded, lens, units)
    if case != "singletons":
        assert len(ids) < T  # the prompts are stored once
    else:
        assert len(ids) == T
    out = seg(input_ids=ids[None], position_ids=pos[None], use_cache=False,
              segment_layout=layout).logits[0].index_select(0, expand)
    (out * w).sum().backward()
    assert float((out - ref).detach().abs().max()) < TOL
    _assert_close_grads(_grads(dense), _grads(seg))
