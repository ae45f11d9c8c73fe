"""Packing, the next-token shift, block-causal masks and micro-batch allocation."""

from __future__ import annotations

import random

import pytest
import torch

from arealite.api.trajectory import pad_sequences_to_tensors
from arealite.engine.packing import (
    balanced_partition,
    block_causal_mask,
    ffd_allocate,
    pack_tensor_dict,
    packing_efficiency,
    seqlens_from_mask,
    split_batch_for_rank,
    split_into_micro_batches,
    unpack_to_padded,
)


def _batch(lens, seed=0):
    rng = random.Random(seed)
    rows = []
    for n in lens:
        p = rng.randint(1, n - 1)
        rows.append({
            "input_ids": [rng.randint(1, 50) for _ in range(n)],
            "loss_mask": [0] * p + [1] * (n - p),
            "logprobs": [0.0] * p + [-rng.random() for _ in range(n - p)],
            "versions": [-1] * p + [3] * (n - p),
            "rewards": float(rng.random()),
        })
    return pad_sequences_to_tensors(rows)


def test_pack_roundtrip_and_next_token_alignment():
    d = _batch([5, 2, 7, 3])
    p = pack_tensor_dict(d)
    lens = seqlens_from_mask(d["attention_mask"])
    assert p["cu_seqlens"].tolist() == [0, 5, 7, 14, 17]
    assert int(p["max_seqlen"]) == 7
    assert p["position_ids"].tolist() == [*range(5), *range(2), *range(7), *range(3)]
    assert torch.equal(unpack_to_padded(p["input_ids"], p["cu_seqlens"], 7), d["input_ids"])
    # slow reference for the shift: packed position i describes token i+1 of the same sequence
    for b, (s, e) in enumerate(zip(p["cu_seqlens"][:-1].tolist(), p["cu_seqlens"][1:].tolist())):
        for i in range(s, e):
            t = i - s
            if t + 1 < int(lens[b]):
                assert int(p["labels"][i]) == int(d["input_ids"][b, t + 1])
                assert bool(p["loss_mask"][i]) == bool(d["loss_mask"][b, t + 1])
                assert float(p["logprobs"][i]) == float(d["logprobs"][b, t + 1])
                assert int(p["versions"][i]) == int(d["versions"][b, t + 1])
            else:  # the last token predicts nothing
                assert int(p["labels"][i]) == 0 and not bool(p["loss_mask"][i])
                assert int(p["versions"][i]) == -1
    # shift_back puts next-token values back on their tokens: logprobs round-trip exactly
    back = unpack_to_padded(p["logprobs"], p["cu_seqlens"], 7, shift_back=True)
    assert torch.equal(back * d["loss_mask"], d["logprobs"] * d["loss_mask"])
    assert torch.equal(p["rewards"], d["rewards"])


def test_left_padding_is_rejected():
    am = torch.tensor([[False, True, True]])
    with pytest.raises(ValueError, match="right-padded"):
        seqlens_from_mask(am)


def test_block_causal_mask_matches_loop():
    cu = torch.tensor([0, 3, 4, 8], dtype=torch.int32)
    m = block_causal_mask(cu, total=10)
    seg = [0, 0, 0, 1, 2, 2, 2, 2, 3, 4]
    for i in range(10):
        for j in range(10):
            assert bool(m[0, 0, i, j]) == (seg[i] == seg[j] and j <= i)
    f = block_causal_mask(cu, dtype=torch.float32)
    assert f.shape == (1, 1, 8, 8)
    assert float(f[0, 0, 3, 3]) == 0.0 and float(f[0, 0, 3, 2]) == torch.finfo(torch.float32).min


@pytest.mark.parametrize("seed", range(5))
def test_ffd_respects_capacity_and_covers_everything(seed):
    rng = random.Random(seed)
    sizes = [rng.randint(1, 60) for _ in range(rng.randint(1, 40))]
    cap = 100
    groups = ffd_allocate(sizes, cap)
    assert sorted(i for g in groups for i in g) == list(range(len(sizes)))
    assert all(sum(sizes[i] for i in g) <= cap for g in groups)
    assert len(groups) <= 2 * sum(sizes) // cap + 1  # FFD is within 11/9 OPT + 1; loose bound
    more = ffd_allocate(sizes, cap, min_groups=len(groups) + 2)
    assert len(more) == len(groups) + 2 or len(sizes) < len(groups) + 2
    assert sorted(i for g in more for i in g) == list(range(len(sizes)))
    assert all(sum(sizes[i] for i in g) <= cap for g in more)


def test_ffd_oversized_item_gets_its_own_group():
    assert ffd_allocate([150, 20, 30], 100) == [[0], [1, 2]]


def test_balanced_partition():
    sizes = [10, 9, 8, 7, 6, 5, 1]
    parts = balanced_partition(sizes, 3)
    assert len(parts) == 3 and all(parts)
    loads = [sum(sizes[i] for i in p) for p in parts]
    assert max(loads) - min(loads) <= max(sizes)
    with pytest.raises(ValueError):
        balanced_partition([1, 2], 3)


def test_micro_batches_restore_input_order():
    d = _batch([9, 3, 8, 2, 7, 4, 6], seed=3)
    mbl = split_into_micro_batches(d, max_tokens_per_mb=12)
    assert all(int(mb["attention_mask"].sum()) <= 12 for mb in mbl.mbs)
    outs = [mb["input_ids"].float() for mb in mbl.mbs]
    assert torch.equal(mbl.restore(outs).long(), d["input_ids"])
    assert packing_efficiency(mbl, "packed") == 1.0
    assert 0 < packing_efficiency(mbl, "padded") <= 1.0
    assert 0 < packing_efficiency(mbl, "budget", 12) <= 1.0


def test_micro_batches_padded_with_dummy_rows():
    d = _batch([4, 5])
    mbl = split_into_micro_batches(d, max_tokens_per_mb=100, min_n_mbs=3)
    assert len(mbl) == 3 and mbl.indices[2] == []
    dummy = mbl.mbs[2]
    assert dummy["input_ids"].shape == (1, 1) and not dummy["loss_mask"].any()
    assert torch.equal(mbl.restore([mb["input_ids"] for mb in mbl.mbs]), d["input_ids"])


def test_split_batch_for_rank_keeps_groups():
    d = _batch([3, 4, 5, 6, 7, 8, 3, 4])
    parts = [split_batch_for_rank(d, r, 2, group_size=2) for r in range(2)]
    assert parts[0]["rewards"].tolist() == d["rewards"][:4].tolist()
    with pytest.raises(ValueError):
        split_batch_for_rank(d, 0, 3, group_size=2)
