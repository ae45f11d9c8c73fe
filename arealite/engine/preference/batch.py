"""Preference rows -> the batches ``PreferenceActor`` trains on (``build_sft_batch`` rows, so
prompts are encoded exactly as for SFT and GRPO)."""

from __future__ import annotations

from typing import Any

import torch

from arealite.api.trajectory import TensorDict
from arealite.engine.sft.lm_engine import build_sft_batch


def _field(row: dict[str, Any], key: str) -> Any:
    if key not in row:
        raise KeyError(f"preference row {row.get('id', '?')} has no '{key}' field "
                       f"(fields: {', '.join(map(str, row))})")
    return row[key]


def dpo_batch(tokenizer: Any, rows: list[dict[str, Any]], prompt_key: str = "prompt",
              chosen_key: str = "chosen", rejected_key: str = "rejected",
              use_chat_template: bool = True) -> TensorDict:
    """Rows ``[chosen_0, rejected_0, chosen_1, ...]`` of ``{prompt, chosen, rejected}`` rows."""
    prompts, completions = [], []
    for r in rows:
        p = str(_field(r, prompt_key))
        prompts += [p, p]
        completions += [str(_field(r, chosen_key)), str(_field(r, rejected_key))]
    return build_sft_batch(tokenizer, prompts, completions, use_chat_template=use_chat_template)


def kto_batches(tokenizer: Any, rows: list[dict[str, Any]], prompt_key: str = "prompt",
                completion_key: str = "completion", label_key: str = "label",
                use_chat_template: bool = True) -> tuple[TensorDict, TensorDict]:
    """The batch of ``{prompt, completion, label}`` rows with a ``desirable`` key, and the
    mismatched batch (prompt ``i`` with completion ``i + 1``) for KTO's reference point."""
    prompts = [str(_field(r, prompt_key)) for r in rows]
    completions = [str(_field(r, completion_key)) for r in rows]
    labels = [_field(r, label_key) for r in rows]
    if not all(isinstance(v, bool) for v in labels):
        raise ValueError(f"KTO '{label_key}' values must be true or false")
    batch = build_sft_batch(tokenizer, prompts, completions, use_chat_template=use_chat_template)
    batch["desirable"] = torch.tensor(labels, dtype=torch.bool)
    shifted = completions[1:] + completions[:1]
    mismatched = build_sft_batch(tokenizer, prompts, shifted, use_chat_template=use_chat_template)
    return batch, mismatched
