"""The packed micro-batches a plan runs: the engine's own ``pack`` on a small real batch, then
every per-token dimension stretched to the planned token count as storage-free fake tensors.

Why not pack the planned batch for real: the attention layout of one 131,072-token sequence
(``segment_attention.sequence_layout``) holds a ``[1, 1, L, L]`` bool mask, 16 GiB of host
memory, and building it is data-dependent (``int(lens.max())``), which fake tensors cannot run.
Packing a template of ``TEMPLATE_LEN`` tokens per sequence keeps the real code path (which keys
the packed dict carries, their dtypes, the layout, the context-parallel slice) and only the
token dimension is scaled: every dimension equal to the template's length (or its
context-parallel share) becomes the planned length (or its share).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from arealite.engine.packing import split_into_micro_batches
from arealite.engine.segment_attention import SegmentLayout

# divisible by every context-parallel size up to 8, and equal to no other dimension of the
# packed dict (rows, the layout's 4 span bounds)
TEMPLATE_LEN = 840
# the packed keys that are token counts, not per-token values: set to the planned count
_COUNTS = ("cu_seqlens", "max_seqlen", "cp_tokens")
# per-token keys kept real: the loss selects its rows by them (every token a loss token: the
# worst case for the head)
_REAL = ("loss_mask",)


def template_batch(vocab_size: int, rows: int, length: int = TEMPLATE_LEN) -> dict[str, Any]:
    """``rows`` padded trajectories of ``length`` tokens each, with what the PPO actor's loss
    reads (``arealite.api.trajectory``'s keys)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, max(4, vocab_size - 1), (rows, length), generator=g)
    ones = torch.ones(rows, length, dtype=torch.long)
    loss_mask = ones.clone()
    loss_mask[:, : length // 8] = 0  # a prompt
    return {"input_ids": ids, "attention_mask": ones, "loss_mask": loss_mask,
            "logprobs": torch.zeros(rows, length), "advantages": torch.ones(rows, length)}


def _scaled_shape(shape: torch.Size, dims: dict[int, int]) -> list[int]:
    return [dims.get(int(d), int(d)) for d in shape]


def _fake_like(t: torch.Tensor, dims: dict[int, int]) -> torch.Tensor:
    """An empty tensor of ``t``'s dtype with its token dimensions scaled (fake under an active
    FakeTensorMode: no storage)."""
    return torch.empty(_scaled_shape(t.shape, dims), dtype=t.dtype, device=t.device)


def _scale_value(v: Any, dims: dict[int, int]) -> Any:
    if isinstance(v, SegmentLayout):
        fields = {}
        for f in dataclasses.fields(v):
            x = getattr(v, f.name)
            if f.name == "cache":
                fields[f.name] = {}
            elif isinstance(x, torch.Tensor):
                fields[f.name] = _fake_like(x, dims)
            elif isinstance(x, int) and not isinstance(x, bool):
                fields[f.name] = dims.get(x, x)
            else:
                fields[f.name] = x
        return SegmentLayout(**fields)
    if isinstance(v, torch.Tensor):
        return _fake_like(v, dims)
    return v


def planned_micro_batches(engine: Any, vocab_size: int, tokens: int, count: int = 2,
                          varlen: bool = False) -> list[dict[str, Any]]:
    """``count`` packed micro-batches of one ``tokens``-long sequence each, as ``engine`` would
    run them (call under ``FakeTensorMode``). ``tokens`` is rounded up to a multiple of the
    context-parallel size (the engine pads to one). ``varlen``: the plan of
    ``attn_impl: flash_attention_2`` (CUDA only), run as one causal segment: the same O(L)
    attention memory, without the layout's ``[1, 1, L, L]`` mask, which the varlen kernel does
    not have (it reads ``cu_seqlens``); the segment path's gathered q/k/v copies stay in (a
    transient overestimate of one layer's q, k, v)."""
    cp = engine.cp.size if engine.cp is not None else 1
    tokens = -(-tokens // cp) * cp
    if tokens < TEMPLATE_LEN:
        raise ValueError(f"plan at least {TEMPLATE_LEN} tokens per micro-batch, not {tokens}")
    with torch._subclasses.fake_tensor.unset_fake_temporarily():
        data = template_batch(vocab_size, count)
        mbl = split_into_micro_batches(data, TEMPLATE_LEN, group=None)
        packed = [engine.pack(mb, idx) for mb, idx in zip(mbl.mbs, mbl.indices)]
    dims = {TEMPLATE_LEN: tokens, TEMPLATE_LEN // cp: tokens // cp}
    out = []
    for p in packed:
        q = {k: _scale_value(v, dims) for k, v in p.items() if k not in _COUNTS + _REAL}
        if varlen and "segment_layout" in q:  # flash-attn varlen: no [L, L] mask
            q["segment_layout"].mask = torch.empty((0,), dtype=torch.bool)
        with torch._subclasses.fake_tensor.unset_fake_temporarily():  # real token counts
            for k in _REAL:
                if k in p:
                    q[k] = torch.ones(_scaled_shape(p[k].shape, dims), dtype=p[k].dtype)
            q["cu_seqlens"] = torch.tensor([0, tokens], dtype=p["cu_seqlens"].dtype)
            if "max_seqlen" in p:
                q["max_seqlen"] = torch.tensor(tokens)
        if "cp_tokens" in p:
            q["cp_tokens"] = tokens
        out.append(q)
    return out


def batch_tensors(packed: dict[str, Any]) -> list[torch.Tensor]:
    """Every tensor a packed micro-batch holds, its attention layout's included."""
    out = []
    for v in packed.values():
        if isinstance(v, SegmentLayout):
            out += [getattr(v, f.name) for f in dataclasses.fields(v)
                    if isinstance(getattr(v, f.name), torch.Tensor)]
        elif isinstance(v, torch.Tensor):
            out.append(v)
    return out
