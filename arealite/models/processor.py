"""Which models take images, and the extra arguments their workflows need.

A model directory whose config has a ``vision_config`` is a vision-language model: its RL
workflow (``workflows.vision.VisionRLVRWorkflow``) and its SFT batches need the model's
processor (``arealite.models.tiny_vl.load_processor``), which the entry scripts pass along.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def is_vision_model(path: str | Path) -> bool:
    from transformers import AutoConfig

    return getattr(AutoConfig.from_pretrained(str(path)), "vision_config", None) is not None


def vision_processor(path: str | Path) -> Any | None:
    """The processor of a vision-language model at ``path``; None for a text-only model."""
    from arealite.models.tiny_vl import load_processor

    return load_processor(path) if is_vision_model(path) else None
