"""Model shapes the planner can build without a model folder: the public ``config.json``
numbers of the Qwen3 family (hub ``Qwen/Qwen3-*``), and a run's own HF config read from its
model folder (``config.json`` only; no weights are read)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_QWEN3 = dict(model_type="qwen3", vocab_size=151936, head_dim=128, rope_theta=1000000.0,
              rms_norm_eps=1e-6, max_position_embeddings=40960, hidden_act="silu")

SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": dict(_QWEN3, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, tie_word_embeddings=True),
    "qwen3-1.7b": dict(_QWEN3, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, tie_word_embeddings=True),
    "qwen3-4b": dict(_QWEN3, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True),
    "qwen3-8b": dict(_QWEN3, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False),
    "qwen3-30b-a3b": dict(_QWEN3, model_type="qwen3_moe", hidden_size=2048,
                          intermediate_size=6144, moe_intermediate_size=768,
                          num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                          num_experts=128, num_experts_per_tok=8, decoder_sparse_step=1,
                          norm_topk_prob=True, mlp_only_layers=[], tie_word_embeddings=False),
}


def shape_config(name: str) -> dict[str, Any]:
    if name not in SHAPES:
        raise ValueError(f"unknown model shape {name!r}: one of {', '.join(SHAPES)}")
    return dict(SHAPES[name])


def read_config(path: str) -> dict[str, Any]:
    """The ``config.json`` of an HF model folder; a shape name from ``SHAPES``, or its hub id
    (``Qwen/Qwen3-8B``), gives that shape without a download."""
    hub = path.lower().removeprefix("qwen/")  # the hub ids of the shapes above
    if hub in SHAPES and not Path(path).exists():
        return shape_config(hub)
    f = Path(path) / "config.json"
    if not f.is_file():
        raise ValueError(f"{path}: no config.json there (the planner needs the model's HF "
                         f"config, or a shape name: {', '.join(SHAPES)})")
    return json.loads(f.read_text())


def write_config_dir(config: dict[str, Any], out: Path) -> Path:
    """An HF folder holding only ``config.json`` (the engine builds random weights from it)."""
    from transformers import AutoConfig

    spec = dict(config)
    cfg = AutoConfig.for_model(spec.pop("model_type"), **spec)
    out.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(str(out))
    return out


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a (possibly vision-language) config."""
    return dict(config.get("text_config") or config)
