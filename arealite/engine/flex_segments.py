"""Packed attention through FlexAttention: the layouts of ``arealite.engine.segment_attention``
(per-sequence causal attention, or the prefix-tree mask of shared-prompt packing) as a block
mask, so the fused kernel skips every block no row needs and the cost grows with Σ Lq·Lk.

The mask is a predicate over packed positions. Query ``q`` belongs to the row that computes it
(``SegmentLayout.spans[:, q]``: that row's own span ``[o0, o1)`` and prefix span ``[p0, p1)``);
it sees key ``k`` when ``k`` is in the own span and ``k <= q``, or ``k`` is in the prefix span and
either ``q`` is past the prefix or ``k <= q``. Positions past the packed length (the length is
padded, ``padded_length``) see only themselves and are dropped from the output.

Where it runs: CUDA, through ``torch.compile(flex_attention)``. On CPU torch has no backward for
it and only an unfused forward that materialises the scores, so the engine refuses
``attn_impl=flex`` there (the forward is still checked against the segment kernel on CPU, in
``tests/engine/test_flex_segments.py``). Non-causal modules (a vision tower over image patches)
and calls without a layout (generation) use plain SDPA, as the segment kernel does.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from arealite.engine.segment_attention import SegmentLayout, segment_attention

ATTN_NAME = "arealite_flex"
BLOCK = 128  # FlexAttention's default block size


def padded_length(T: int) -> int:
    """The packed length the kernel runs at: the next power of two (at least one block), so a
    run compiles a handful of shapes, not one per micro-batch. Padding positions attend only
    to themselves, so their blocks are all but skipped."""
    return max(BLOCK, 1 << (T - 1).bit_length())


def padded_spans(layout: SegmentLayout, length: int) -> torch.Tensor:
    """``layout.spans`` extended to ``length`` positions; a padding position's own span is itself."""
    T = layout.spans.shape[1]
    if length == T:
        return layout.spans
    pad = torch.arange(T, length, device=layout.spans.device)
    extra = torch.stack([pad, pad + 1, torch.zeros_like(pad), torch.zeros_like(pad)])
    return torch.cat([layout.spans, extra], 1)


def mask_predicate(spans: torch.Tensor):
    """The ``mask_mod(b, h, q, k)`` of a layout's spans (see the module docstring)."""
    o0, o1, p0, p1 = spans[0], spans[1], spans[2], spans[3]

    def mask_mod(b, h, q, k):
        causal = k <= q
        in_own = (k >= o0[q]) & (k < o1[q])
        in_prefix = (k >= p0[q]) & (k < p1[q])
        q_in_prefix = (q >= p0[q]) & (q < p1[q])
        return (in_own & ~q_in_prefix & causal) | (in_prefix & (~q_in_prefix | causal))

    return mask_mod


@functools.cache
def _kernels(device_type: str):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if device_type == "cuda":  # the fused kernel; eager flex materialises the scores
        return torch.compile(flex_attention, dynamic=False), functools.partial(
            create_block_mask, _compile=True)
    return flex_attention, create_block_mask


def block_mask(layout: SegmentLayout, length: int, device: torch.device):
    """The layout's block mask for a packed length padded to ``length`` (built once per
    micro-batch and kept in ``layout.cache``: every layer reuses it)."""
    key = ("flex", length)
    if key not in layout.cache:
        make = _kernels(device.type)[1]
        layout.cache[key] = make(mask_predicate(padded_spans(layout, length)), None, None,
                                 length, length, device=device)
    return layout.cache[key]


def flex_segment_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    segment_layout: SegmentLayout | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention interface: ``query [1, H, T, D]``, ``key/value [1, Hkv, T, D]``
    -> ``[1, T, H, D]``."""
    if segment_layout is None or not getattr(module, "is_causal", True):
        # plain SDPA, as the segment kernel runs these calls
        return segment_attention(module, query, key, value, attention_mask, dropout, scaling,
                                 **kwargs)
    if query.shape[0] != 1:
        raise ValueError("flex segment attention runs on one packed row (batch size 1)")
    if dropout:
        raise ValueError("flex segment attention has no attention dropout")
    T = query.shape[2]
    length = padded_length(T)
    if length != T:
        pad = (0, 0, 0, length - T)
        query, key, value = F.pad(query, pad), F.pad(key, pad), F.pad(value, pad)
    attend = _kernels(query.device.type)[0]
    out = attend(query, key, value, block_mask=block_mask(segment_layout, length, query.device),
                 scale=scaling, enable_gqa=query.shape[1] != key.shape[1])
    return out[:, :, :T].transpose(1, 2).contiguous(), None


def register() -> str:
    """Register ``flex_segment_attention`` with transformers (idempotent); returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, flex_segment_attention)
    return ATTN_NAME
