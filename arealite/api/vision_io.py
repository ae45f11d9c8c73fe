"""The image part of the trajectory contract: how a prompt with images is encoded, and the
keys that carry a row's images to the trainer.

A vision-language prompt is the model's chat template with one image part per image before
the question, encoded by the model's processor (which expands each image placeholder to the
image's number of merged patches and computes the patches). RL workflows and SFT batches both
encode through ``encode_vision_prompt``, so the trainer sees the prompt the server was sent.
A trajectory row with images adds (``image_keys``):

- ``pixel_values``     ``[B, N*D]`` float32  the row's N patches of size D, flattened
- ``image_grid_thw``   ``[B, 3*K]`` int64    (t, h, w) of each of the row's K images
- ``image_token_mask`` ``[B, S]``   bool     True on the prompt's image tokens (never the completion's)

Both per-row image keys are right-padded with zeros when rows are concatenated (a zero grid is
no image); the trainer's packing (``arealite.engine.vision_pack``) reads them.
"""

from __future__ import annotations

from typing import Any

import torch


def open_image(item: Any):
    """A row's image: a PIL image, or a path to one (opened as RGB)."""
    from PIL import Image

    if isinstance(item, Image.Image):
        return item.convert("RGB")
    with Image.open(item) as img:
        return img.convert("RGB")


def encode_vision_prompt(processor: Any, question: str, images: list,
                         system_prompt: str | None = None) -> tuple[list[int], str, dict]:
    """Prompt ids (placeholders expanded), the prompt text, and the processor's output (with
    ``pixel_values`` and ``image_grid_thw``) for ``images`` (PIL images or paths)."""
    images = [open_image(x) for x in images]
    if not images:
        raise ValueError("a vision prompt needs at least one image")
    parts = [{"type": "image"} for _ in images]
    msgs = [{"role": "user", "content": [*parts, {"type": "text", "text": question}]}]
    if system_prompt:
        msgs.insert(0, {"role": "system", "content": system_prompt})
    text = processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    enc = processor(text=[text], images=images, return_tensors="pt")
    enc["images"] = images
    return enc["input_ids"][0].tolist(), text, enc


def image_keys(encs: list[dict], image_token_id: int, input_ids: torch.Tensor
               ) -> dict[str, torch.Tensor]:
    """The image keys of a padded trajectory, one processor output per row (its prompt).

    ``image_token_mask`` marks the image tokens of each row's prompt only: a completion that
    samples the image token id is ordinary text (no image is behind it), as it is to the server
    that sampled it."""
    width = max(int(e["pixel_values"].numel()) for e in encs)
    gwidth = max(int(e["image_grid_thw"].numel()) for e in encs)
    pixels = torch.zeros(len(encs), width)
    grids = torch.zeros(len(encs), gwidth, dtype=torch.long)
    for b, e in enumerate(encs):
        flat = e["pixel_values"].float().reshape(-1)
        pixels[b, : flat.numel()] = flat
        g = e["image_grid_thw"].long().reshape(-1)
        grids[b, : g.numel()] = g
    prompt_lens = torch.tensor([int(e["input_ids"].shape[-1]) for e in encs])
    in_prompt = torch.arange(input_ids.shape[1])[None] < prompt_lens[:, None]
    return {"pixel_values": pixels, "image_grid_thw": grids,
            "image_token_mask": (input_ids == image_token_id) & in_prompt}
