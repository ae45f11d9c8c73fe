"""A tiny Qwen2-architecture model (or its Qwen3-MoE twin, or the Qwen2-VL model of
``arealite.demo.tiny_vl``), built locally with the tokenizer of ``arealite.demo.tiny_tokenizer``.

Nothing can be downloaded on our machines, so tests, the main job and the benchmarks use a model
built here from a config (``TinyModelSpec``, ``arealite.demo.tiny_spec``), saved as an HF
directory that ``AutoTokenizer`` and ``AutoModelForCausalLM`` load. Everything is deterministic
for a given seed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from arealite.demo.tiny_spec import TinyModelSpec, save_random_model
from arealite.demo.tiny_tokenizer import build_tokenizer
from arealite.demo.tiny_vl import build_tiny_vl_model

__all__ = ["TinyModelSpec", "build_tiny_model", "build_tiny_moe", "text_config_kwargs"]


def build_tiny_model(out_dir: str | Path, spec: TinyModelSpec | None = None) -> Path:
    """Build tokenizer + randomly initialised Qwen2 model (Qwen3-MoE with ``spec.moe``) into
    ``out_dir`` (an HF directory)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    spec = spec or TinyModelSpec()
    if spec.vision:
        return build_tiny_vl_model(out_dir, spec)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out, spec)
    if spec.moe:
        return build_tiny_moe(out, spec, tok)
    config = Qwen2Config(**text_config_kwargs(spec, tok))
    return save_random_model(out, Qwen2ForCausalLM, config, tok, spec)


def text_config_kwargs(spec: TinyModelSpec, tok: Any) -> dict[str, Any]:
    """The decoder settings the dense model and its MoE twin share (sizes, special tokens)."""
    return dict(
        vocab_size=len(tok),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings,
        initializer_range=spec.initializer_range,
        bos_token_id=None,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        torch_dtype="float32",
    )


def build_tiny_moe(out: Path, spec: TinyModelSpec, tok: Any) -> Path:
    """The MoE twin of the dense model: Qwen3-MoE with the same sizes, its MLPs made of experts.

    The router picks ``num_experts_per_tok`` of ``num_experts`` by softmax then top-k, with the
    chosen weights renormalised (``norm_topk_prob``, as Qwen3-30B-A3B ships).
    """
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        **text_config_kwargs(spec, tok),
        moe_intermediate_size=spec.moe_intermediate_size,
        num_experts=spec.num_experts,
        num_experts_per_tok=spec.num_experts_per_tok,
        norm_topk_prob=True,
        head_dim=spec.hidden_size // spec.num_attention_heads,
    )
    return save_random_model(out, Qwen3MoeForCausalLM, config, tok, spec)
