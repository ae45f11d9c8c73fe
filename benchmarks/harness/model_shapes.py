"""Model shapes the benchmarks build from a config (random weights, nothing downloaded), and the
FLOP count their MFU figures use.

- ``qwen2-0.5b``, ``qwen3-0.6b``: the published ``config.json`` shapes (hub ``Qwen/Qwen2-0.5B``,
  ``Qwen/Qwen3-0.6B``);
- ``tiny-vocab``: Qwen's 151,936-token vocabulary (tied) over a 64-wide, 2-layer body, so the LM
  head dominates as it does for long traces of small models (the CPU form of the long-context
  benchmark).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SHAPES: dict[str, dict[str, Any]] = {
    "qwen2-0.5b": dict(
        model_type="qwen2",
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        tie_word_embeddings=True,
        use_sliding_window=False,
    ),
    "qwen3-0.6b": dict(
        model_type="qwen3",
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=131072,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
    "tiny-vocab": dict(
        model_type="qwen2",
        vocab_size=151936,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=131072,
        tie_word_embeddings=True,
    ),
}


def hf_config(name: str, **overrides: Any) -> Any:
    """The transformers config of shape ``name``, with ``overrides`` applied."""
    from transformers import AutoConfig

    spec = {**SHAPES[name], **overrides}
    return AutoConfig.for_model(spec.pop("model_type"), **spec)


def config_dir(name: str, out: Path, **overrides: Any) -> Path:
    """An HF directory holding only the config (an engine with ``init_from_scratch`` builds the
    weights)."""
    out.mkdir(parents=True, exist_ok=True)
    hf_config(name, **overrides).save_pretrained(str(out))
    return out


def model_flops(cfg: Any, n_params: int, lens: list[int]) -> float:
    """Forward + backward FLOPs of one step over sequences of ``lens`` tokens: 6 N per token (a
    tied head counted once, as its matmul) plus causal attention, 6 L^2 H d per layer;
    recomputation not counted."""
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    attn = sum(6 * L * L * cfg.num_attention_heads * d for L in lens) * cfg.num_hidden_layers
    return 6.0 * n_params * sum(lens) + attn
