"""A one-label sequence classifier (a reward model's architecture) from a causal LM checkpoint:
the backbone's weights, a fresh ``score`` head drawn from ``seed``, the tokenizer copied. What
the reward-model trainer starts from, and, untrained, what tests and benchmarks serve."""

from __future__ import annotations

from pathlib import Path

import torch


def reward_model_from_causal_lm(base_dir: str | Path, out_dir: str | Path, seed: int = 0,
                                dtype: torch.dtype = torch.float32) -> Path:
    """Write ``*ForSequenceClassification`` (``num_labels=1``) built on ``base_dir``'s backbone
    to ``out_dir``; returns ``out_dir``."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    torch.manual_seed(seed)
    # transformers reports the new head as "MISSING" and the LM head as "UNEXPECTED": exactly
    # what this function means to do, so its load report is not shown
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model = AutoModelForSequenceClassification.from_pretrained(str(base_dir), num_labels=1,
                                                                   dtype=dtype)
    finally:
        hf_logging.set_verbosity(level)
    out = Path(out_dir)
    model.save_pretrained(str(out))
    AutoTokenizer.from_pretrained(str(base_dir)).save_pretrained(str(out))
    return out
