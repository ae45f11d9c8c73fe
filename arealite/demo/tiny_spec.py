"""What a tiny model is (``TinyModelSpec``: sizes, seed, tokenizer corpus, text, vision or MoE)
and how a seeded random model of it is saved: what the text models (``arealite.demo.tiny``) and
the vision-language model (``arealite.demo.tiny_vl``) share, below both.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass
class TinyModelSpec:
    seed: int = 0
    vocab_size: int = 384
    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 2
    num_attention_heads: int = 4  # head_dim = 32
    num_key_value_heads: int = 2
    max_position_embeddings: int = 512
    tie_word_embeddings: bool = False  # untied: servers reload weights in place
    # text the tokenizer is trained on: "toy_math", or "toy_tools" (toy math plus calculator
    # tool-call traces, so a tool call is tens of tokens rather than one per character)
    corpus: str = "toy_math"
    # a Qwen2-VL vision-language model (arealite.demo.tiny_vl) instead of a text-only Qwen2;
    # its tokenizer also carries the vision tokens and the toy vision task's questions
    vision: bool = False
    # a Qwen3-MoE mixture-of-experts model instead of the dense Qwen2: every layer's MLP is
    # ``num_experts`` experts of ``moe_intermediate_size``, ``num_experts_per_tok`` routed per
    # token (same attention, tokenizer and task as the dense model)
    moe: bool = False
    num_experts: int = 4
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 192
    # std of the random init (transformers' default 0.02); larger makes an untrained model's
    # outputs depend strongly on its weights (benchmarks/studies/routing_replay.py)
    initializer_range: float = 0.02



def save_random_model(out: Path, model_cls: Any, config: Any, tok: Any, spec: TinyModelSpec) -> Path:
    """``model_cls(config)`` with the spec's seeded random weights, its generation config (EOS,
    pad) and the spec, saved into ``out``."""
    import torch
    from transformers import GenerationConfig

    torch.manual_seed(spec.seed)
    model = model_cls(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    from transformers.utils import logging as hf_logging

    # one shard written in milliseconds: its progress bar is only noise in a job's first lines
    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(str(out), safe_serialization=True)
    finally:
        if shown:
            hf_logging.enable_progress_bar()
    (out / "arealite_tiny_spec.json").write_text(json.dumps(asdict(spec), indent=2))
    return out
