"""Multimodal prompts on the embedded server: images -> patches, placeholders, M-RoPE positions.

A vision-language model (Qwen2-VL family: a ``vision_config`` and an ``image_token_id``) takes
a prompt whose images are runs of the image token. As SGLang does, a run may come collapsed (one
``<|image_pad|>`` per image, as a chat template writes it) or already expanded by the client's
processor (as many as the image has merged patches); either way it leaves here expanded, so the
response's prompt length is what the trainer sees. Per sequence we keep the patches, the grid
sizes, the model's multimodal rope positions of the prompt and the offset every later token's
position carries (``rope_delta``); the engine's prefill runs the vision tower and places its
embeddings on the image tokens, decode steps only add ``rope_delta`` to plain positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class VisionPrompt:
    pixel_values: torch.Tensor  # [num_patches, C * T * P * P], the processor's flattened patches
    image_grid_thw: torch.Tensor  # [num_images, 3]
    rope_positions: torch.Tensor  # [3, prompt_len] the model's M-RoPE positions of the prompt
    rope_delta: int  # token i >= prompt_len sits at position i + rope_delta on every axis
    image_token_id: int
    image_slots: torch.Tensor  # [num_image_tokens] prompt positions of the image tokens, sorted


class VisionPreprocessor:
    """The model's image processor and rope index, used on the HTTP side before the engine."""

    def __init__(self, model_path: str, model: Any) -> None:
        from transformers import AutoImageProcessor

        self.image_processor = AutoImageProcessor.from_pretrained(model_path)
        self.config = model.config
        self.merge = int(self.config.vision_config.spatial_merge_size)
        self.image_token_id = int(self.config.image_token_id)
        self._rope_index = model.model.get_rope_index

    def prepare(self, ids: list[int], images: list) -> tuple[list[int], VisionPrompt | None]:
        """Expanded prompt ids and the sequence's ``VisionPrompt`` (None without images)."""
        runs = _runs(ids, self.image_token_id)
        if not images:
            if runs:
                raise ValueError(f"the prompt holds {len(runs)} image placeholder(s) but no "
                                 "image_data was given")
            return ids, None
        if len(runs) != len(images):
            raise ValueError(f"the prompt holds {len(runs)} image placeholder run(s) "
                             f"(token {self.image_token_id}) but image_data has {len(images)} image(s)")
        enc = self.image_processor(images=images, return_tensors="pt")
        grid = enc["image_grid_thw"].long()
        counts = (grid.prod(-1) // self.merge**2).tolist()
        out: list[int] = []
        prev = 0
        for k, ((start, length), n) in enumerate(zip(runs, counts)):
            if length not in (1, n):
                raise ValueError(f"image {k}: its placeholder run has {length} tokens; the image "
                                 f"needs {n} (or 1, to be expanded here)")
            out += ids[prev:start] + [self.image_token_id] * n
            prev = start + length
        out += ids[prev:]
        ids_t = torch.tensor([out])
        types = (ids_t == self.image_token_id).int()
        pos, delta = self._rope_index(ids_t, types, image_grid_thw=grid)
        return out, VisionPrompt(enc["pixel_values"], grid, pos[:, 0], int(delta.view(-1)[0]),
                                 self.image_token_id, types[0].nonzero().view(-1))


def _runs(ids: list[int], token: int) -> list[tuple[int, int]]:
    """``(start, length)`` of each maximal run of ``token`` in ``ids``."""
    runs: list[tuple[int, int]] = []
    i, n = 0, len(ids)
    while i < n:
        if ids[i] == token:
            j = i
            while j < n and ids[j] == token:
                j += 1
            runs.append((i, j - i))
            i = j
        else:
            i += 1
    return runs


def rope_positions(positions: torch.Tensor, prompts: list[VisionPrompt | None]) -> torch.Tensor:
    """``[3, B, T]`` M-RoPE positions for rows whose tokens sit at KV slots ``positions [B, T]``:
    prompt slots take the prompt's own positions, later slots ``slot + rope_delta``."""
    rope = positions.unsqueeze(0).expand(3, -1, -1).clone()
    for b, vp in enumerate(prompts):
        if vp is None:
            continue
        n = vp.rope_positions.shape[1]
        slots = positions[b]
        in_prompt = slots < n
        rope[:, b] = slots + vp.rope_delta
        if bool(in_prompt.any()):
            rope[:, b, in_prompt] = vp.rope_positions[:, slots[in_prompt]].to(rope.device)
    return rope


def attach_images(pre: VisionPreprocessor | None, body: dict[str, Any], items: list,
                  prompts: list[list[int]], context_len: int) -> list[VisionPrompt | None]:
    """Load a ``/generate`` body's ``image_data`` and expand ``prompts`` in place; returns one
    ``VisionPrompt`` (or None) per item (items are prompt-major: ``n`` samples per prompt).
    Raises ValueError (a 400) on any bad image, placeholder mismatch or overlong prompt."""
    from servers.protocol.images import load_image, split_image_data

    raw = body.get("image_data")
    if raw is None or raw == []:
        if pre is None:
            return [None] * len(items)
    elif pre is None:
        raise ValueError("image_data was given but this model has no vision tower")
    text = body.get("text")
    single = isinstance(text, str) if text is not None else isinstance(body["input_ids"][0], int)
    n = items[0].params.n if items else 1
    batch = len(items) // max(1, n)
    groups = split_image_data(raw, batch, single)
    out: list[VisionPrompt | None] = []
    cache: dict[int, tuple[list[int], VisionPrompt | None]] = {}
    for i in range(len(items)):
        p = i // n
        if p not in cache:
            images = [load_image(x, f"image_data[{p}][{k}]") for k, x in enumerate(groups[p])]
            cache[p] = pre.prepare(prompts[i], images)
        ids, vp = cache[p]
        if len(ids) >= context_len:
            raise ValueError(f"The input ({len(ids)} tokens with its images) is longer than the "
                             f"model's context length ({context_len} tokens).")
        prompts[i] = list(ids)
        out.append(vp)
    return out
