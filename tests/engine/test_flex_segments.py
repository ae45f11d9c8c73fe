"""FlexAttention over segment layouts: the mask predicate equals the layout's own mask, and the
model's logits (CPU: forward; CUDA: forward and gradients) equal the dense block-causal mask's."""

from __future__ import annotations

import random

import pytest
import torch

from arealite.engine import flex_segments
from arealite.engine.attn_impl import resolve_attn_impl
from arealite.engine.packing import block_causal_mask
from arealite.engine.prefix_pack import share_prefixes
from arealite.engine.segment_attention import SegmentLayout, sequence_layout

DEVICES = ["cpu"] + ([pytest.param("cuda", marks=pytest.mark.cuda)] if torch.cuda.is_available() else [])


def _rows(seed: int, shared: bool) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(seed)
    rows, units = [], []
    for g in range(5):
        prompt = [rng.randint(3, 300) for _ in range(rng.randint(1, 40))]
        k = rng.randint(2, 5) if shared else 1
        for i in range(k):
            rows.append(prompt + [rng.randint(3, 300) for _ in range(rng.randint(0 if i else 1, 30))])
            units.append(g)
    return rows, units


def _layout(rows, units, shared: bool):
    """(ids [T'], position_ids [T'], expand [T] or None, layout) of one packed micro-batch."""
    lens = torch.tensor([len(r) for r in rows])
    if shared:
        padded = torch.zeros(len(rows), int(lens.max()), dtype=torch.long)
        for i, r in enumerate(rows):
            padded[i, : len(r)] = torch.tensor(r)
        return share_prefixes(padded, lens, units)
    cu = torch.zeros(len(rows) + 1, dtype=torch.int32)
    cu[1:] = lens.cumsum(0)
    ids = torch.tensor([t for r in rows for t in r])
    pos = torch.cat([torch.arange(n) for n in lens.tolist()])
    return ids, pos, None, sequence_layout(cu)


def _dense_from_layout(lay: SegmentLayout, T: int) -> torch.Tensor:
    """The [T, T] attention pattern the segment kernel computes, read from its index tensors."""
    out = torch.zeros(T, T, dtype=torch.bool)
    q = lay.q_index.view(lay.rows, lay.q_len)
    kv = lay.kv_index.view(lay.rows, lay.kv_len)
    m = lay.mask[:, 0]
    for r in range(lay.rows):
        for s in range(lay.q_len):
            if lay.inverse[q[r, s]] != r * lay.q_len + s:
                continue  # a padding query slot
            out[q[r, s], kv[r][m[r, s]]] = True
    return out


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_mask_predicate_equals_layout(shared, seed):
    rows, units = _rows(seed, shared)
    ids, _, _, lay = _layout(rows, units, shared)
    T = len(ids)
    L = flex_segments.padded_length(T)
    mod = flex_segments.mask_predicate(flex_segments.padded_spans(lay, L))
    qi, ki = torch.meshgrid(torch.arange(L), torch.arange(L), indexing="ij")
    got = mod(0, 0, qi, ki)
    assert torch.equal(got[:T, :T], _dense_from_layout(lay, T))
    assert torch.equal(got[T:, T:], torch.eye(L - T, dtype=torch.bool))  # padding: itself only
    assert not got[T:, :T].any() and not got[:T, T:].any()


def test_flex_is_refused_on_cpu():
    with pytest.raises(ValueError, match="needs device=cuda"):
        resolve_attn_impl("flex", torch.device("cpu"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shared", [False, True])
def test_flex_logits_equal_dense_mask(tiny_model_dir, device, shared):
    """CPU runs the unfused forward only (torch has no CPU backward); CUDA also compares the
    gradients, with the compiled kernel."""
    from transformers import AutoModelForCausalLM

    dense = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), attn_implementation="sdpa")
    flex = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir),
                                                attn_implementation=flex_segments.register())
    dense.to(device), flex.to(device)
    rows, units = _rows(7, shared)
    lens = torch.tensor([len(r) for r in rows])
    cu = torch.zeros(len(rows) + 1, dtype=torch.int32)
    cu[1:] = lens.cumsum(0)
    full = torch.tensor([t for r in rows for t in r], device=device)[None]
    pos = torch.cat([torch.arange(n) for n in lens.tolist()]).to(device)[None]
    grad = device == "cuda"
    with torch.set_grad_enabled(grad):
        ref = dense(input_ids=full, attention_mask=block_causal_mask(cu).to(device),
                    position_ids=pos, use_cache=False).logits[0]
        ids, spos, expand, lay = _layout(rows, units, shared)
        out = flex(input_ids=ids.to(device)[None], position_ids=spos.to(device)[None],
                   use_cache=False, segment_layout=lay.to(device)).logits[0]
        if expand is not None:
            out = out.index_select(0, expand.to(device))
    assert float((out - ref).detach().abs().max()) < 2e-5
    if grad:
        w = torch.randn(ref.shape, generator=torch.Generator().manual_seed(2)).to(device)
        (ref * w).sum().backward()
        (out * w).sum().backward()
        for (n, a), (_, b) in zip(dense.named_parameters(), flex.named_parameters()):
            scale = float(a.grad.abs().max()) + 1e-6
            assert float((a.grad - b.grad).abs().max()) / scale < 1e-4, n
