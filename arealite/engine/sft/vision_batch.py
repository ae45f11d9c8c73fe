"""SFT batches with images: the vision-language counterpart of ``lm_engine.build_sft_batch``.

Each prompt is encoded as the RL workflow encodes it (``arealite.api.vision_io``), so SFT
teaches exactly what GRPO samples; the loss covers the completion and EOS, and the rows carry
their images in the trajectory contract's image keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from arealite.api.trajectory import TensorDict, pad_sequences_to_tensors
from arealite.api.vision_io import encode_vision_prompt, image_keys


def build_vision_sft_batch(processor: Any, questions: Sequence[str], images: Sequence[list],
                           completions: Sequence[str]) -> TensorDict:
    """A padded batch of (question + images, completion) rows."""
    if not (len(questions) == len(images) == len(completions)) or not questions:
        raise ValueError("questions, images and completions must be equally long and non-empty")
    tok = processor.tokenizer
    if tok.eos_token_id is None:
        raise ValueError("the tokenizer has no eos_token_id")
    rows, encs = [], []
    for q, imgs, c in zip(questions, images, completions):
        p_ids, _, enc = encode_vision_prompt(processor, q, imgs)
        c_ids = tok(c, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        rows.append({"input_ids": p_ids + c_ids, "loss_mask": [0] * len(p_ids) + [1] * len(c_ids)})
        encs.append(enc)
    batch = pad_sequences_to_tensors(rows)
    image_id = tok.convert_tokens_to_ids(processor.image_token)
    return {**batch, **image_keys(encs, image_id, batch["input_ids"])}
