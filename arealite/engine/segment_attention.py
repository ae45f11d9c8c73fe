"""Packed attention without a dense ``[T, T]`` mask: each sequence's queries attend to its own
keys in a padded ``[rows, heads, Lq, Lk]`` SDPA call, so the cost grows with Σ Lq·Lk (≈ Σ Lᵢ²)
instead of (Σ Lᵢ)².

A packed micro-batch holds ``T`` tokens. A *row* is one sequence seen by attention: its keys
are a *prefix span* (possibly empty) followed by an *own span*, both contiguous ranges of the
packed tokens; its queries are the own span, plus the prefix span when the row *owns* it. With
empty prefixes this is plain per-sequence causal attention over a packed batch. With a shared
prompt (``arealite.engine.prefix_pack``) the prompt is stored once, the first completion's row
owns it and every other completion's row reads it as a prefix: a prefix-tree mask.

Why not FlexAttention: on CPU torch 2.13's ``flex_attention`` has no backward ("FlexAttention
does not support backward on CPU"), and without ``torch.compile`` it materialises the dense
scores anyway; this gather + SDPA runs everywhere with autograd and no compilation. On CUDA
with ``flash_attn`` installed the engine keeps varlen flash attention (no shared prompts).

The attention function is registered with transformers as ``arealite_segments``; the engine
passes the layout as the ``segment_layout`` keyword of the model's forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

ATTN_NAME = "arealite_segments"


@dataclass
class SegmentLayout:
    """Index tensors of one packed micro-batch (see the module docstring)."""

    q_index: torch.Tensor  # [R * Lq] packed position of each query slot (0 for padding)
    kv_index: torch.Tensor  # [R * Lk] packed position of each key slot (0 for padding)
    mask: torch.Tensor  # [R, 1, Lq, Lk] True = attend
    inverse: torch.Tensor  # [T] flat query slot that computes each packed position
    rows: int
    q_len: int
    kv_len: int
    # [4, T] per packed position, the spans of the row whose query computes it: own start, own
    # end, prefix start, prefix end (the same layout as a mask predicate, for FlexAttention)
    spans: torch.Tensor
    # every row's queries start at its first key (plain sequences, and prefix owners): ``mask``
    # is then SDPA's own causal mask for every real query, and attention runs without it
    causal: bool = False
    cache: dict = field(default_factory=dict, compare=False, repr=False)  # e.g. a block mask

    def to(self, device: torch.device) -> SegmentLayout:
        return SegmentLayout(self.q_index.to(device), self.kv_index.to(device),
                             self.mask.to(device), self.inverse.to(device),
                             self.rows, self.q_len, self.kv_len, self.spans.to(device),
                             self.causal)


def build_layout(prefix_start: torch.Tensor, prefix_len: torch.Tensor, own_start: torch.Tensor,
                 own_len: torch.Tensor, owns_prefix: torch.Tensor, total: int) -> SegmentLayout:
    """Layout from per-row spans (all ``[R]`` long tensors, ``owns_prefix`` bool).

    Every packed position ``< total`` must be a query of exactly one row. Query ``s`` of a row
    sits at row position ``qpos = (0 if owns_prefix else prefix_len) + s`` and attends to the
    row's keys ``j <= qpos``: causal attention over prefix + own span.
    """
    R = len(own_len)
    kv_lens = prefix_len + own_len
    q_start = torch.where(owns_prefix, 0, prefix_len)
    q_lens = kv_lens - q_start
    Lk = int(kv_lens.max()) if R else 1
    Lq = int(q_lens.max()) if R else 1
    j = torch.arange(Lk)
    kv = torch.where(j[None] < prefix_len[:, None], prefix_start[:, None] + j[None],
                     own_start[:, None] + j[None] - prefix_len[:, None])
    kv_valid = j[None] < kv_lens[:, None]
    kv = torch.where(kv_valid, kv, 0)
    s = torch.arange(Lq)
    qpos = q_start[:, None] + s[None]  # [R, Lq] position of each query inside its row
    q_valid = s[None] < q_lens[:, None]
    qi = kv.gather(1, qpos.clamp(max=Lk - 1))
    qi = torch.where(q_valid, qi, 0)
    mask = kv_valid[:, None, :] & (j[None, None, :] <= qpos[:, :, None])
    # padding queries attend to key slot 0 (always real): no all-masked row, so no NaN that a
    # zero gradient could turn into NaN in backward; their outputs are never read
    mask[:, :, 0] |= ~q_valid
    flat = torch.arange(R * Lq).view(R, Lq)
    inverse = torch.full((total,), -1, dtype=torch.long)
    inverse[qi[q_valid]] = flat[q_valid]
    if bool((inverse < 0).any()):
        raise ValueError("segment layout leaves packed positions without a query row")
    row = inverse // Lq
    spans = torch.stack([own_start, own_start + own_len, prefix_start, prefix_start + prefix_len])
    return SegmentLayout(qi.reshape(-1), kv.reshape(-1), mask[:, None], inverse, R, Lq, Lk,
                         spans[:, row].long(), causal=bool((q_start == 0).all()))


def sequence_layout(cu_seqlens: torch.Tensor) -> SegmentLayout:
    """Per-sequence causal attention over packed sequences (no shared prefixes)."""
    cu = cu_seqlens.long().cpu()
    lens = cu[1:] - cu[:-1]
    zero = torch.zeros_like(lens)
    return build_layout(zero, zero, cu[:-1], lens, torch.ones_like(lens, dtype=torch.bool),
                        int(cu[-1]))


def segment_attention(
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
    -> ``[1, T, H, D]``. Without a layout (e.g. generation), or in a non-causal module (a
    vision tower's attention over image patches, not over the packed tokens), it is plain SDPA."""
    if segment_layout is None or not getattr(module, "is_causal", True):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      dropout=dropout, scaling=scaling, **kwargs)
    lay = segment_layout
    if query.shape[0] != 1:
        raise ValueError("segment attention runs on one packed row (batch size 1)")
    H, D = query.shape[1], query.shape[3]
    Hkv = key.shape[1]
    q = query[0].index_select(1, lay.q_index).view(H, lay.rows, lay.q_len, D).transpose(0, 1)
    k = key[0].index_select(1, lay.kv_index).view(Hkv, lay.rows, lay.kv_len, D).transpose(0, 1)
    v = value[0].index_select(1, lay.kv_index).view(Hkv, lay.rows, lay.kv_len, -1).transpose(0, 1)
    # A causal layout needs no mask: SDPA's own causal mask equals it for every real query
    # (padding queries then read padding keys, which are real tokens' copies; their outputs are
    # never read, so no gradient comes back from them). Without a mask the CPU kernel keeps
    # O(L) memory; a [rows, 1, L, L] mask is converted to floats and kept for backward, one per
    # layer (about 290 MiB per layer for two rows of 6,144 tokens), and context parallelism
    # cannot split it (every rank attends over the whole sequence).
    mask = None if lay.causal else lay.mask
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling,
                                         dropout_p=dropout, is_causal=lay.causal,
                                         enable_gqa=H != Hkv)
    out = out.transpose(1, 2).reshape(lay.rows * lay.q_len, H, -1).index_select(0, lay.inverse)
    return out[None], None


def register() -> str:
    """Register ``segment_attention`` with transformers (idempotent); returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, segment_attention)
    return ATTN_NAME
