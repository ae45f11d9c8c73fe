"""Load a transformers causal LM and run batched forwards over the slot KV cache.

The runner knows nothing of requests: the scheduler gives it rows, the tokens to append to
each row, and where each row's tokens start; it returns final hidden states, and turns chosen
hidden states into float32 logits. Device and dtype are configuration (``cpu``/``cuda``,
``float32``/``bfloat16``), never separate code paths.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from pathlib import Path

import torch

from servers.engine.kv_cache import SlotKVCache, causal_slot_mask
from servers.engine.lora import LoRAManager

logger = logging.getLogger(__name__)

_DTYPES = {
    "auto": None,
    "half": torch.float16,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float": torch.float32,
    "float32": torch.float32,
}


def resolve_dtype(name: str, config_dtype: torch.dtype | str | None) -> torch.dtype:
    """SGLang's ``--dtype`` values; ``auto`` takes the checkpoint's dtype (float32 if unknown)."""
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(_DTYPES)}")
    if _DTYPES[name] is not None:
        return _DTYPES[name]
    if isinstance(config_dtype, torch.dtype):
        return config_dtype
    if isinstance(config_dtype, str) and isinstance(getattr(torch, config_dtype, None), torch.dtype):
        return getattr(torch, config_dtype)
    return torch.float32



def cache_kwarg(forward: Callable) -> str:
    """The name under which ``forward`` takes a KV cache: ``cache`` or ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"

def is_embedding_model(config, is_embedding_flag: bool) -> bool:
    """As SGLang decides: a ``*ForSequenceClassification`` / ``*ForRewardModel`` checkpoint is
    never a generation model; ``--is-embedding`` asks for scoring explicitly, which the embedded
    server supports for such classifiers only."""
    archs = list(getattr(config, "architectures", None) or [])
    classifier = any(a.endswith(("ForSequenceClassification", "ForRewardModel")) for a in archs)
    if is_embedding_flag and not classifier:
        raise ValueError(f"--is-embedding: the embedded server scores with sequence-classification "
                         f"models (a reward model), and this checkpoint is {archs or 'unknown'}")
    return classifier


def model_class(is_generation: bool, is_vision_language: bool = False):
    """A reward model loads as a sequence classifier, a vision-language model (it has a
    ``vision_config``) with its own Auto class, anything else as a causal LM."""
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
        AutoModelForSequenceClassification,
    )

    if not is_generation:
        return AutoModelForSequenceClassification
    return AutoModelForImageTextToText if is_vision_language else AutoModelForCausalLM


class ModelRunner:
    """Owns the model, its tokenizer and the KV cache."""

    def __init__(
        self,
        model_path: str,
        dtype: str = "auto",
        device: str = "cpu",
        context_length: int | None = None,
        tokenizer_path: str | None = None,
        skip_tokenizer_init: bool = False,
        is_embedding: bool = False,
    ) -> None:
        from transformers import AutoConfig, AutoTokenizer

        self.model_path = str(model_path)
        if not Path(self.model_path).is_dir():
            raise FileNotFoundError(f"--model-path {self.model_path!r} is not a directory")
        self.device = torch.device(device)
        config = AutoConfig.from_pretrained(self.model_path)
        self.dtype = resolve_dtype(dtype, getattr(config, "dtype", None) or getattr(config, "torch_dtype", None))
        # a reward model (sequence classifier) scores on /classify instead of generating
        self.is_generation = not is_embedding_model(config, is_embedding)
        is_vl = getattr(config, "vision_config", None) is not None
        self.model = model_class(self.is_generation, is_vl).from_pretrained(
            self.model_path, dtype=self.dtype, attn_implementation="sdpa"
        ).to(self.device)
        self.model.eval()
        self.model.requires_grad_(False)
        self.config = self.model.config
        self.tokenizer = None
        if not skip_tokenizer_init:
            self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path or self.model_path)
        head = self.model.get_output_embeddings() if self.is_generation else self.model.get_input_embeddings()
        self.vocab_size = int(head.weight.shape[0])
        model_ctx = int(getattr(self.config, "max_position_embeddings", 2048) or 2048)
        self.context_len = int(context_length or model_ctx)
        self.eos_token_ids = self._eos_ids()
        text_cfg = self.config.get_text_config() if hasattr(self.config, "get_text_config") else self.config
        n_heads = text_cfg.num_attention_heads
        head_dim = getattr(text_cfg, "head_dim", None) or text_cfg.hidden_size // n_heads
        self.cache = SlotKVCache(
            num_layers=text_cfg.num_hidden_layers,
            kv_heads=getattr(text_cfg, "num_key_value_heads", None) or n_heads,
            head_dim=head_dim,
            dtype=self.dtype,
            device=self.device,
            # Room for a padded prefill on top of the longest allowed sequence.
            max_len=2 * self.context_len + 8,
        )
        self.softcap = getattr(text_cfg, "final_logit_softcapping", None)
        self.decoder = self.model.base_model
        self.vision = None  # servers.engine.vision.VisionPreprocessor of a vision-language model
        if is_vl and self.is_generation:
            from servers.engine.vision import VisionPreprocessor

            self.vision = VisionPreprocessor(self.model_path, self.model)
            self.decoder = self.model.model.language_model  # the text decoder under the tower
        self.lm_head = self.model.get_output_embeddings()  # None for a classifier
        self.score_head = None if self.is_generation else self.model.get_submodule("score")
        # Llama-style decoders (Llama, Qwen2, Mistral, ...) with only full-attention layers can be
        # driven layer by layer; anything else goes through the decoder's own forward.
        layer_types = set(getattr(text_cfg, "layer_types", None) or ["full_attention"])
        self._lean = layer_types == {"full_attention"} and all(
            hasattr(self.decoder, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")
        )
        # transformers >= 5.24 names the decoder's cache argument ``cache`` (``past_key_values``
        # is deprecated there and goes in 5.40); older versions know only ``past_key_values``.
        self._cache_kw = cache_kwarg(self.decoder.forward)
        self._layer_cache_kw = cache_kwarg(self.decoder.layers[0].forward) if self._lean else ""
        self.lora: LoRAManager | None = None  # set by the launcher under --enable-lora
        # servers.engine.routed_experts.RoutedExpertsCapture under --enable-return-routed-experts
        self.routed = None
        self.num_hidden_layers = int(text_cfg.num_hidden_layers)

    def enable_routed_experts(self) -> None:
        """Record each forward's expert choices (raises ValueError on a model without experts)."""
        from servers.engine.routed_experts import RoutedExpertsCapture

        self.routed = RoutedExpertsCapture(self.decoder, self.num_hidden_layers)

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        for src in (getattr(self.model, "generation_config", None), self.config):
            eos = getattr(src, "eos_token_id", None) if src is not None else None
            if isinstance(eos, int):
                ids.add(eos)
            elif isinstance(eos, (list, tuple)):
                ids.update(int(e) for e in eos)
        if not ids and self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        return ids

    @torch.inference_mode()
    def forward(self, r0: int, tokens: torch.Tensor, starts: torch.Tensor,
                vision: list | None = None, loras: list | None = None) -> torch.Tensor:
        """Append ``tokens [B, T]`` to rows ``[r0, r0+B)`` whose new tokens start at ``starts``;
        ``loras`` names each row's LoRA adapter (None: the base model) when LoRA is enabled.

        Returns the last hidden states ``[B, T, H]``. Rows shorter than T are right-padded by the
        caller; their padded positions are written past the row's real tokens and overwritten
        later, and the mask keeps every real query from seeing them. ``vision``: one
        ``servers.engine.vision.VisionPrompt`` or None per row, for a vision-language model's rows with
        images (their image embeddings and multimodal rope positions).
        """
        b, t = tokens.shape
        if self.lora is not None:
            self.lora.set_rows(loras or [None] * b)
        positions = starts.view(-1, 1) + torch.arange(t, device=self.device).view(1, -1)
        kv_len = int(starts.max().item()) + t
        self.cache.ensure(r0 + b, kv_len)
        self.cache.bind(r0, r0 + b, positions, kv_len)
        mask = causal_slot_mask(positions, kv_len)
        embeds = rope = None
        if vision is not None:
            from servers.engine.vision import rope_positions

            embeds = self._embed_with_images(tokens, positions, vision)
            rope = rope_positions(positions, vision)
        if self._lean:
            return self._lean_forward(tokens, positions, mask, embeds, rope)
        inputs = {"input_ids": tokens} if embeds is None else {"inputs_embeds": embeds}
        out = self.decoder(
            **inputs,
            position_ids=positions if rope is None else rope,
            attention_mask=mask,
            use_cache=False,
            **{self._cache_kw: self.cache},
        )
        return out.last_hidden_state

    def _embed_with_images(self, tokens: torch.Tensor, positions: torch.Tensor,
                           vision: list) -> torch.Tensor:
        """Token embeddings with the vision tower's output on the prompt's image tokens."""
        hidden = self.decoder.embed_tokens(tokens)
        for b, vp in enumerate(vision):
            if vp is None:
                continue
            n = vp.rope_positions.shape[1]
            slot = (tokens[b] == vp.image_token_id) & (positions[b] < n)
            if not bool(slot.any()):
                continue  # decode steps: the images are already in the KV cache
            feats = self.model.model.get_image_features(
                vp.pixel_values.to(self.device), vp.image_grid_thw.to(self.device))
            emb = torch.cat(list(feats.pooler_output)).to(hidden.dtype)
            # the k-th image token of the prompt takes the k-th merged patch embedding
            rank = torch.searchsorted(vp.image_slots.to(self.device), positions[b, slot])
            hidden[b, slot] = emb[rank]
        return hidden

    def _lean_forward(self, tokens, positions, mask, embeds=None, rope=None) -> torch.Tensor:
        """The decoder's own modules, called without its output-capturing wrappers.

        Same modules and maths as ``decoder(...)`` (a test checks equality); it skips per-call
        bookkeeping that costs as much as the compute for small models.
        """
        dec = self.decoder
        hidden = dec.embed_tokens(tokens) if embeds is None else embeds
        pos_emb = dec.rotary_emb(hidden, positions if rope is None else rope)
        for layer in dec.layers:
            hidden = layer(hidden, attention_mask=mask, position_embeddings=pos_emb,
                           position_ids=positions, use_cache=False,
                           **{self._layer_cache_kw: self.cache})
            if isinstance(hidden, tuple):
                hidden = hidden[0]
        return dec.norm(hidden)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits for hidden states ``[..., H]``."""
        logits = self.lm_head(hidden).float()
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    @torch.inference_mode()
    def score(self, prompts: list[list[int]]) -> list[list[float]]:
        """A classifier's head at each prompt's last token (SGLang's ``PoolingType.LAST``), one
        float32 list of ``num_labels`` values per prompt; one right-padded forward, no KV cache."""
        if self.score_head is None:
            raise ValueError("this model generates; it has no score head")
        lens = torch.tensor([len(p) for p in prompts], device=self.device)
        ids = torch.zeros(len(prompts), int(lens.max()), dtype=torch.long, device=self.device)
        for i, p in enumerate(prompts):
            ids[i, : len(p)] = torch.tensor(p, dtype=torch.long)
        mask = (torch.arange(ids.shape[1], device=self.device)[None] < lens[:, None]).long()
        hidden = self.decoder(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
        last = hidden[torch.arange(len(prompts), device=self.device), lens - 1]
        return self.score_head(last).float().cpu().tolist()
