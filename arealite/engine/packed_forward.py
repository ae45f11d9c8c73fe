"""How one packed micro-batch runs through the model (``FSDPEngine`` mixes this in): the batch
split into micro-batches of at most ``max_tokens_per_mb`` tokens (GRPO groups kept together
when they share a prompt), each packed into one row with its attention layout (per-sequence
segments, the shared-prompt layout, or this context-parallel rank's slice; images kept with
their rows), and the forward that returns its logits, or the fused head's ``HeadInput``.

The attention choices: a layout kernel (``segments``/``flex``: ``segment_layout``), varlen
flash attention (``cu_seqlens``), or a dense block-diagonal causal mask (sdpa/eager). With
routing replay on, the server's experts are replayed first (``routing_replay.replay_rows``).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from arealite.api.trajectory import TensorDict
from arealite.engine import context_parallel, segment_attention
from arealite.engine.attn_impl import LAYOUT_IMPLS
from arealite.engine.lm_head import HeadInput, capture_head
from arealite.engine.packing import (
    MicroBatchList,
    block_causal_mask,
    pack_tensor_dict,
    split_into_micro_batches,
)
from arealite.engine.prefix_pack import group_units, share_prefixes, shared_sizes
from arealite.engine.routing_replay import replay_rows
from arealite.engine.vision_pack import VISION_KEYS, image_placeholders, pack_images, patch_dim


class PackedForward:
    """The forward pieces of ``FSDPEngine``, over its model, attention implementation,
    context-parallel group and prefix-sharing settings."""

    @property
    def shares_prefixes(self) -> bool:
        return self.prefix_group_size > 1 and self.attn_impl in LAYOUT_IMPLS and self.cp is None

    def split_micro_batches(self, input_: TensorDict) -> MicroBatchList:
        data = {k: v.to(self.device) if isinstance(v, torch.Tensor) else v
                for k, v in input_.items()}
        units = sizes = None
        if self.shares_prefixes:
            units = group_units(data["input_ids"].shape[0], self.prefix_group_size)
            sizes = shared_sizes(data["input_ids"], data["attention_mask"].sum(1), units)
        return split_into_micro_batches(data, self.config.max_tokens_per_mb, group=self.dp_group,
                                        units=units, unit_sizes=sizes)

    def pack(self, mb: TensorDict, rows: list[int]) -> TensorDict:
        """The packed micro-batch the model runs on, with its attention layout (``rows``: the
        batch rows of ``mb``, which tell the GRPO groups apart)."""
        images = {k: mb.pop(k) for k in VISION_KEYS if k in mb}
        p = pack_tensor_dict(mb)
        if images and self.cp is not None:
            raise ValueError("context_parallel_size > 1 does not serve rows with images yet")
        if images:  # each row's images stay with its tokens (arealite.engine.vision_pack)
            mb.update(images)
            p.update(pack_images(mb, patch_dim(self.hf_config), self.model.model.get_rope_index))
        if self.attn_impl not in LAYOUT_IMPLS:
            return p
        if self.shares_prefixes and rows and not images:
            ids, pos, expand, layout = share_prefixes(
                mb["input_ids"], mb["attention_mask"].sum(1),
                [r // self.prefix_group_size for r in rows])
            p.update(shared_input_ids=ids, shared_position_ids=pos, expand_index=expand)
        else:
            layout = segment_attention.sequence_layout(p["cu_seqlens"]).to(self.device)
        p["segment_layout"] = layout
        return context_parallel.shard_packed(p, self.cp)  # this rank's token slice under cp

    @property
    def fuses_head(self) -> bool:
        """Loss functions get a ``HeadInput`` instead of logits (``logprob_head: fused``)."""
        return self.model_kind == "causal_lm" and self._fused_head

    def model_forward(self, packed: TensorDict) -> torch.Tensor | HeadInput:
        """Logits ``[T, V]`` of one packed micro-batch (sequences never attend to each other),
        or, with the fused head, the ``HeadInput`` they would come from (no ``[T, V]``)."""
        model = self._check_ready()
        if self.routing is not None:
            self.routing.replay(replay_rows(packed))
        if not self.fuses_head:
            return self._model_forward(model, packed)
        with capture_head(model, self.config.logprob_chunk_size) as box:
            hidden = self._model_forward(model, packed)
        head = box["head"]
        head.hidden = hidden  # [T, H], after expand_index like logits would be
        return head

    def _model_forward(self, model: torch.nn.Module, packed: TensorDict) -> torch.Tensor:
        ids = packed["input_ids"][None]
        pos = packed["position_ids"][None]
        cu = packed["cu_seqlens"]
        kwargs: dict[str, Any] = {}
        placeholders = contextlib.nullcontext()
        if "rope_position_ids" in packed:
            # text positions first, then the M-RoPE axes: transformers' layout for packed rows
            pos = torch.cat([pos[None], packed["rope_position_ids"][:, None]])
            if "pixel_values" in packed:
                kwargs.update(pixel_values=packed["pixel_values"],
                              image_grid_thw=packed["image_grid_thw"])
                placeholders = image_placeholders(model.model, packed["image_token_mask"])
        if "segment_layout" in packed:
            ids = packed.get("shared_input_ids", packed["input_ids"])[None]
            if "rope_position_ids" not in packed:  # (no shared prompts with images)
                pos = packed.get("shared_position_ids", packed["position_ids"])[None]
            if self.cp is not None:
                kwargs["cp_group"] = self.cp
            with placeholders:
                out = model(input_ids=ids, position_ids=pos, use_cache=False,
                            segment_layout=packed["segment_layout"], **kwargs)
            logits = out.logits[0]
            if "expand_index" in packed:  # back to the ordinary packed layout
                logits = logits.index_select(0, packed["expand_index"])
            return logits
        if self.attn_impl == "flash_attention_2":
            # varlen flash attention: sequence boundaries from cu_seqlens, no dense mask
            mx = int(packed["max_seqlen"])
            kwargs.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=mx, max_length_k=mx)
            mask = None
        elif self.attn_impl == "eager":
            mask = block_causal_mask(cu, ids.shape[1], dtype=self.compute_dtype)
        else:
            mask = block_causal_mask(cu, ids.shape[1], dtype=torch.bool)
        with placeholders:
            out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False,
                        **kwargs)
        return out.logits[0]
