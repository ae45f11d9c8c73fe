"""SFT batches with images: the vision-language counterpart of ``lm_engine.build_sft_batch``.

Each prompt is encoded as the RL workflow encodes it (``arealite.api.vision_io``), so SFT
teaches exactly what GRPO samples; the loss covers the completion and EOS, and the rows carry
their images in the trajectory contract's image keys.

An SFT run sees each row once an epoch; ``RowEncodings`` keeps each row's encoding for the next
epochs. The processor's call (chat template, image patches, placeholder expansion) is per row
and costs about as much as the tiny vision model's training step on it (measured on the toy
vision task: ~1.3 ms a row, a third of the SFT step).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from arealite.api.trajectory import TensorDict, pad_sequences_to_tensors
from arealite.api.vision_io import encode_vision_prompt, image_keys


class RowEncodings:
    """Each row's encoding (token ids, loss mask, the processor's tensors), kept by its question,
    image paths and completion until the kept pixels reach ``max_bytes``; rows whose images are
    in-memory images (no path to key them by) are encoded every time."""

    def __init__(self, max_bytes: int = 2 << 30):
        self.max_bytes = max_bytes
        self.kept_bytes = 0
        self.rows: dict[tuple, tuple[dict[str, list[int]], dict]] = {}

    def key(self, question: str, images: list, completion: str) -> tuple | None:
        if not all(isinstance(x, str) for x in images):
            return None
        return (question, tuple(images), completion)

    def keep(self, key: tuple | None, row: dict[str, list[int]], enc: dict) -> None:
        size = int(enc["pixel_values"].nbytes)
        if key is not None and self.kept_bytes + size <= self.max_bytes:
            self.rows[key] = (row, enc)
            self.kept_bytes += size


def encode_sft_row(processor: Any, question: str, images: list, completion: str
                   ) -> tuple[dict[str, list[int]], dict]:
    """One row: ({input_ids, loss_mask}, the prompt's processor output without its images)."""
    tok = processor.tokenizer
    p_ids, _, enc = encode_vision_prompt(processor, question, images)
    c_ids = tok(completion, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    enc = {k: v for k, v in enc.items() if k != "images"}  # image_keys reads the tensors only
    return {"input_ids": p_ids + c_ids, "loss_mask": [0] * len(p_ids) + [1] * len(c_ids)}, enc


def build_vision_sft_batch(processor: Any, questions: Sequence[str], images: Sequence[list],
                           completions: Sequence[str], kept: RowEncodings | None = None
                           ) -> TensorDict:
    """A padded batch of (question + images, completion) rows; with ``kept``, a row encoded
    before is not encoded again."""
    if not (len(questions) == len(images) == len(completions)) or not questions:
        raise ValueError("questions, images and completions must be equally long and non-empty")
    tok = processor.tokenizer
    if tok.eos_token_id is None:
        raise ValueError("the tokenizer has no eos_token_id")
    rows, encs = [], []
    for q, imgs, c in zip(questions, images, completions):
        key = kept.key(q, imgs, c) if kept is not None else None
        if key is not None and key in kept.rows:
            row, enc = kept.rows[key]
        else:
            row, enc = encode_sft_row(processor, q, imgs, c)
            if kept is not None:
                kept.keep(key, row, enc)
        rows.append({k: list(v) for k, v in row.items()})
        encs.append(enc)
    batch = pad_sequences_to_tensors(rows)
    image_id = tok.convert_tokens_to_ids(processor.image_token)
    return {**batch, **image_keys(encs, image_id, batch["input_ids"])}
