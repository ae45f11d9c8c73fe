"""Images of a packed micro-batch for a vision-language model (Qwen2-VL family).

A trajectory row carries its images beside its tokens (``arealite.api.vision_io``):
``pixel_values [B, N*D]`` (the processor's N flattened patches of size D, zero-padded),
``image_grid_thw [B, 3*K]`` (K images' grids, zero rows past the last) and ``image_token_mask
[B, S]`` (True on image tokens). Packing keeps each row's images with its tokens: the patches
and grids of the micro-batch's rows are concatenated in row order, the order in which their
image tokens appear in the packed row, and each row's multimodal rope positions are the model's
own (``get_rope_index``) for that row alone, so a row sees the positions it would see unpacked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from arealite.api.trajectory import TensorDict

VISION_KEYS = ("pixel_values", "image_grid_thw", "image_token_mask")


def pack_images(mb: TensorDict, patch_dim: int, rope_index: Callable) -> TensorDict:
    """``pixel_values [P, D]``, ``image_grid_thw [K, 3]``, ``rope_position_ids [3, T]`` and
    ``image_token_mask [T]`` of a padded micro-batch ``mb`` (T: its real tokens, packed in row
    order)."""
    lens = mb["attention_mask"].sum(1).tolist()
    pixels, grids, ropes = [], [], []
    for b, n in enumerate(lens):
        grid = mb["image_grid_thw"][b].view(-1, 3).long()
        grid = grid[grid.prod(-1) > 0]
        ids = mb["input_ids"][b, :n][None]
        types = mb["image_token_mask"][b, :n][None].int()
        if len(grid):
            patches = int(grid.prod(-1).sum())
            pixels.append(mb["pixel_values"][b, : patches * patch_dim].view(patches, patch_dim))
            grids.append(grid)
            pos, _ = rope_index(ids, types, image_grid_thw=grid)
            ropes.append(pos[:, 0])
        else:
            ropes.append(torch.arange(n, device=ids.device).expand(3, -1))
    masks = [mb["image_token_mask"][b, :n] for b, n in enumerate(lens)]
    out: TensorDict = {"rope_position_ids": torch.cat(ropes, dim=1),
                       "image_token_mask": torch.cat(masks)}
    if pixels:
        out["pixel_values"] = torch.cat(pixels)
        out["image_grid_thw"] = torch.cat(grids)
    return out


@contextmanager
def image_placeholders(vl_model, mask: torch.Tensor) -> Iterator[None]:
    """Within the block, ``vl_model`` (a Qwen2-VL-family base model) places image features on
    ``mask`` (``[T]``: the packed prompts' image tokens), not on every token whose id is the image
    token's. transformers' own placeholder mask is ``input_ids == image_token_id``: a completion
    that sampled that id would take an image feature that does not exist (a count mismatch), where
    the server that sampled it embedded it as an ordinary token."""

    def placeholder_mask(input_ids, inputs_embeds, image_features=None, video_features=None):
        m = mask.to(inputs_embeds.device).view(inputs_embeds.shape[:-1])
        if image_features is not None and int(m.sum()) * inputs_embeds.shape[-1] != image_features.numel():
            raise ValueError(f"{int(m.sum())} image tokens in the packed prompts but image features "
                             f"for {image_features.numel() // inputs_embeds.shape[-1]}")
        none = torch.zeros_like(m)
        return m[..., None].expand_as(inputs_embeds), none[..., None].expand_as(inputs_embeds)

    vl_model.get_placeholder_mask = placeholder_mask
    try:
        yield
    finally:
        del vl_model.get_placeholder_mask  # back to the class's method


def patch_dim(hf_config) -> int:
    """D, the length of one flattened patch: channels x temporal patch x patch x patch."""
    v = hf_config.vision_config
    return int(v.in_channels * v.temporal_patch_size * v.patch_size**2)
