"""Which attention kernel the trainer's model runs on packed micro-batches (``attn_impl``)."""

from __future__ import annotations

import torch

from arealite.engine import context_parallel, flex_segments, segment_attention

# kernels that read a packed micro-batch's SegmentLayout (and so can share GRPO prompts)
LAYOUT_IMPLS = (segment_attention.ATTN_NAME, flex_segments.ATTN_NAME, context_parallel.ATTN_NAME)


def resolve_attn_impl(attn_impl: str, device: torch.device) -> str:
    """The transformers attention name for a config's ``attn_impl`` on ``device``.

    ``auto``: flash-attn varlen on CUDA when the package is installed, else per-sequence
    segment attention (``segments``, registered with transformers under its own name).
    ``flex``: the same layouts as a FlexAttention block mask (CUDA only). ``sdpa``/``eager``:
    a dense block-causal mask.
    """
    if attn_impl == "auto" and device.type == "cuda":
        try:
            import flash_attn  # noqa: F401

            return "flash_attention_2"
        except ImportError:
            pass
    if attn_impl in ("auto", "segments"):
        return segment_attention.register()
    if attn_impl == "flex":
        if device.type != "cuda":
            raise ValueError("attn_impl=flex needs device=cuda (torch has no FlexAttention "
                             "backward on CPU); use segments")
        return flex_segments.register()
    if attn_impl == "flash_attention_2" and device.type != "cuda":
        raise ValueError("attn_impl=flash_attention_2 needs device=cuda")
    return attn_impl
