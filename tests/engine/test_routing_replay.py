"""Routing replay on the trainer: the router hook against a slow per-token reference, the
trajectory's routed experts through padding, packing and prefix sharing, the stats."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from arealite.api.trajectory import (
    RoutedExpertsError,
    concat_padded_tensors,
    join_routed_experts,
    pad_sequences_to_tensors,
    routed_experts_row,
)
from arealite.engine.packing import dummy_row, pack_tensor_dict
from arealite.engine.routing_replay import (
    RoutingReplay,
    find_routers,
    replay_rows,
    replay_weights,
    topk_agreement,
)


def _reference_weights(logits: torch.Tensor, experts: torch.Tensor, renorm: bool) -> torch.Tensor:
    out = torch.zeros(experts.shape)
    for t in range(logits.shape[0]):
        z = [float(v) for v in logits[t]]
        m = max(z)
        e = [np.exp(v - m) for v in z]
        p = [v / sum(e) for v in e]
        w = [p[int(i)] for i in experts[t]]
        s = sum(w) if renorm else 1.0
        for j, v in enumerate(w):
            out[t, j] = v / s
    return out


@pytest.mark.parametrize("renorm", [True, False])
def test_replay_weights_match_a_per_token_reference(renorm):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(7, 6, generator=g) * 3
    experts = torch.stack([torch.randperm(6, generator=g)[:2] for _ in range(7)])
    got = replay_weights(logits, experts, renorm)
    assert torch.allclose(got, _reference_weights(logits, experts, renorm), atol=1e-6)
    own = logits.topk(2, -1).indices
    assert topk_agreement(own, own.flip(-1)).all()
    assert topk_agreement(own, experts).tolist() == [
        set(a.tolist()) == set(b.tolist()) for a, b in zip(own, experts)
    ]


@pytest.fixture(scope="module")
def moe_model(tiny_moe_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_moe_dir), dtype=torch.float32)


def test_replayed_forward_runs_the_given_experts_and_own_routing_where_minus_one(moe_model):
    rr = RoutingReplay(moe_model, moe_model.config.num_hidden_layers)
    try:
        assert sorted(find_routers(moe_model)) == [0, 1] and rr.width == 4
        ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
        rr.replay(None)
        free = moe_model(ids).logits
        seen: dict[int, torch.Tensor] = {}
        hooks = [
            r.register_forward_hook(lambda m, a, o, i=i: seen.__setitem__(i, o[2]))
            for i, r in rr.routers.items()
        ]
        rr.replay(None)
        moe_model(ids)
        own = torch.cat([seen[0], seen[1]], -1)  # [T, L*k], layer-major
        assert torch.equal(moe_model(ids).logits, free)
        rr.replay(own)  # replaying the model's own choice changes nothing
        assert torch.allclose(moe_model(ids).logits, free, atol=1e-6)
        stats = rr.take_stats()
        assert stats["moe/agreement"] == 1.0 and stats["moe/max_load/layer0"] >= 1.0
        other = (own + 1) % 4  # every token elsewhere
        other[-1] = -1  # the last token keeps its own routing
        rr.replay(other)
        moe_model(ids)
        for layer in (0, 1):
            assert torch.equal(seen[layer][:-1], other[:-1, 2 * layer : 2 * layer + 2])
            assert torch.equal(seen[layer][-1], own[-1, 2 * layer : 2 * layer + 2])
        assert rr.take_stats()["moe/agreement"] == 0.0  # top-2 of 4 shifted by one: never equal
        with pytest.raises(ValueError, match="2 layers x top-2 = 4"):
            rr.replay(torch.zeros(6, 3, dtype=torch.int32))
        rr.replay(torch.zeros(5, 4, dtype=torch.int32))
        with pytest.raises(ValueError, match="5 tokens of routed experts"):
            moe_model(ids)
    finally:
        for h in hooks:
            h.remove()
        rr.close()


def test_routed_experts_pad_join_and_pack_on_their_own_token():
    a = routed_experts_row(np.arange(8, dtype=np.int32).reshape(4, 2), 5)
    assert a[-1].tolist() == [-1, -1] and a[0].tolist() == [0, 1]
    with pytest.raises(RoutedExpertsError, match="3 rows of routed experts for 5 tokens"):
        routed_experts_row(np.zeros((3, 2), np.int32), 5)
    rows = [
        {"input_ids": [1, 2, 3, 4, 5], "loss_mask": [0, 0, 1, 1, 1], "routed_experts": a},
        {
            "input_ids": [6, 7, 8],
            "loss_mask": [0, 1, 1],
            "routed_experts": routed_experts_row(np.full((2, 2), 3, np.int32), 3),
        },
    ]
    batch = pad_sequences_to_tensors(rows)
    assert (
        batch["routed_experts"].shape == (2, 5, 2) and batch["routed_experts"][1, 3:].eq(-1).all()
    )
    wide = concat_padded_tensors(
        [pad_sequences_to_tensors(rows[1:]), pad_sequences_to_tensors(rows[:1])]
    )
    assert wide["routed_experts"].shape == (2, 5, 2) and wide["routed_experts"][0, 3:].eq(-1).all()
    packed = pack_tensor_dict(batch)
    # not shifted: packed row t is the routing of packed input token t
    assert packed["routed_experts"].tolist() == a.tolist() + [[3, 3], [3, 3], [-1, -1]]
    assert dummy_row(batch)["routed_experts"].eq(-1).all()
    # shared prompts (two rows, one prompt token in common): each shared token takes its
    # packed rows' routing, and no row's last token (-1) overwrites it
    rows = torch.tensor([[0, 1], [2, 3], [-1, -1], [0, 1], [4, 5], [-1, -1]])
    shared = {
        "routed_experts": rows,
        "shared_input_ids": torch.zeros(5),
        "expand_index": torch.tensor([0, 1, 2, 0, 3, 2]),
    }
    assert replay_rows(shared).tolist() == [[0, 1], [2, 3], [-1, -1], [4, 5], [-1, -1]]


def test_join_keeps_the_rows_held_and_adds_the_rest():
    known = np.zeros((3, 2), np.int32)
    new = np.ones((4, 2), np.int32)  # rows 1..4 (start 1)
    assert join_routed_experts(known, new, 1).tolist() == [[0, 0]] * 3 + [[1, 1]] * 2
    assert join_routed_experts(None, new).shape == (4, 2)
    with pytest.raises(RoutedExpertsError, match="start at row 4, after the 3 held"):
        join_routed_experts(known, new, 4)
    with pytest.raises(RoutedExpertsError, match="width"):
        join_routed_experts(known, np.ones((5, 3), np.int32))
