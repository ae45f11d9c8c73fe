"""Which models take images, the extra arguments their workflows need, and how their
processor is loaded.

A model directory whose config has a ``vision_config`` is a vision-language model: its RL
workflow (``workflows.vision.VisionRLVRWorkflow``) and its SFT batches need the model's
processor (``load_processor``), which the entry scripts pass along.

``load_processor`` is ``AutoProcessor`` when it loads, else ``Qwen2VLProcessor`` built from the
directory's image processor and tokenizer without the video processor (transformers 5 wants
torchvision for that one; images do not need it). The processor's maths (image resizing,
patches, the expansion of ``<|image_pad|>``) is transformers' own either way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def is_vision_model(path: str | Path) -> bool:
    from transformers import AutoConfig

    return getattr(AutoConfig.from_pretrained(str(path)), "vision_config", None) is not None


def vision_processor(path: str | Path) -> Any | None:
    """The processor of a vision-language model at ``path``; None for a text-only model."""
    return load_processor(path) if is_vision_model(path) else None


def _processor_class():
    from transformers import Qwen2VLProcessor

    class ImageOnlyQwen2VLProcessor(Qwen2VLProcessor):
        """Qwen2VLProcessor that accepts no video processor (images only)."""

        def check_argument_for_proper_class(self, argument_name: str, argument: Any):
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    return ImageOnlyQwen2VLProcessor


def load_processor(path: str | Path):
    """The processor of a vision-language model directory (see the module docstring)."""
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer

    try:
        proc = AutoProcessor.from_pretrained(str(path))
        if hasattr(proc, "image_processor") and hasattr(proc, "tokenizer"):
            return proc
    except (ImportError, AttributeError, ValueError, TypeError):
        pass  # no torchvision: transformers cannot build the video half
    tok = AutoTokenizer.from_pretrained(str(path))
    return _processor_class()(image_processor=AutoImageProcessor.from_pretrained(str(path)),
                              tokenizer=tok, chat_template=tok.chat_template)
