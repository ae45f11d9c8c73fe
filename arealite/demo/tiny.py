"""A tiny Qwen2-architecture model and a byte-level BPE tokenizer, built locally.

Nothing can be downloaded on our machines, so tests, the main job and the benchmarks use a model
built here from a config. The tokenizer is trained with ``tokenizers`` on text from the toy task
(digits split one per token, so arithmetic is learnable), carries Qwen-style special tokens and a
chat template, and saves as an HF directory that ``AutoTokenizer`` and ``AutoModelForCausalLM``
load. Everything is deterministic for a given seed.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END]
# Qwen2-VL's vision tokens: an image is <|vision_start|> <|image_pad|> x N <|vision_end|>
VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
IMAGE_PAD, VIDEO_PAD = "<|image_pad|>", "<|video_pad|>"
VISION_TOKENS = [VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD]

# Qwen2.5-style template; ``add_generation_prompt`` opens the assistant turn. Plain chats render
# exactly as Qwen2's; with ``tools`` the system turn lists them (name and parameter names only,
# to keep tiny-model prompts short), an assistant's ``tool_calls`` render as Hermes
# ``<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>`` blocks and ``tool`` results
# come back as a user turn of ``<tool_response>`` blocks, as Qwen2.5's template does.
CHAT_TEMPLATE = (
    "{% if tools %}"
    "{{ '<|im_start|>system\n' }}"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\n\n' }}{% endif %}"
    "{{ '# Tools\n<tools>' }}"
    "{% for tool in tools %}{% set f = tool['function'] if tool['function'] is defined else tool %}"
    "{{ '\n' + f['name'] + '(' }}"
    "{% if f['parameters'] is defined and f['parameters']['properties'] is defined %}"
    "{{ f['parameters']['properties'] | list | join(', ') }}{% endif %}{{ ')' }}"
    "{% endfor %}"
    "{{ '\n</tools><|im_end|>\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if tools and loop.first and message['role'] == 'system' %}"
    "{% elif message['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}"
    "{{ '<|im_start|>user' }}{% endif %}"
    "{{ '\n<tool_response>\n' + message['content'] + '\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}"
    "{{ '<|im_end|>\n' }}{% endif %}"
    "{% elif message['role'] == 'assistant' and message['tool_calls'] %}"
    "{{ '<|im_start|>assistant' }}"
    "{% if message['content'] %}{{ '\n' + message['content'] }}{% endif %}"
    "{% for call in message['tool_calls'] %}"
    "{% set f = call['function'] if call['function'] is defined else call %}"
    "{{ '\n<tool_call>\n{\"name\": \"' + f['name'] + '\", \"arguments\": ' }}"
    "{{ f['arguments'] | tojson }}{{ '}\n</tool_call>' }}"
    "{% endfor %}"
    "{{ '<|im_end|>\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + (message['content'] or '') + '<|im_end|>' + '\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


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


def _tokenizer_corpus(seed: int, corpus: str = "toy_math", vision: bool = False) -> list[str]:
    from arealite.demo.toy_math import generate_toy_math

    if corpus not in ("toy_math", "toy_tools"):
        raise ValueError(f"unknown tokenizer corpus {corpus!r}: toy_math or toy_tools")

    rows = generate_toy_math(n=3000, seed=seed)
    texts = []
    for r in rows:
        texts.append(f"{IM_START}user\n{r['question']}{IM_END}\n{IM_START}assistant\n")
        texts.append(r["answer"])
    texts.append("The capital of France is Paris. Answer again: wrong, try once more.")
    if corpus == "toy_tools":
        from arealite.demo.toy_tools import corpus_texts

        texts += corpus_texts(seed=seed)
    if vision:
        from arealite.demo.toy_vision import corpus_texts as vision_texts

        texts += vision_texts()
    return texts


def build_tokenizer(out_dir: str | Path, spec: TinyModelSpec | None = None):
    """Train and save the tokenizer; returns a ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    spec = spec or TinyModelSpec()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=SPECIAL_TOKENS + (VISION_TOKENS if spec.vision else []),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tokenizer_corpus(spec.seed, spec.corpus, spec.vision), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        bos_token=None,
        unk_token=None,
        additional_special_tokens=[IM_START] + (VISION_TOKENS if spec.vision else []),
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))
    return fast


def build_tiny_model(out_dir: str | Path, spec: TinyModelSpec | None = None) -> Path:
    """Build tokenizer + randomly initialised Qwen2 model (Qwen3-MoE with ``spec.moe``) into
    ``out_dir`` (an HF directory)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    spec = spec or TinyModelSpec()
    if spec.vision:
        from arealite.demo.tiny_vl import build_tiny_vl_model

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
