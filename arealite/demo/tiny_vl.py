"""A tiny Qwen2-VL vision-language model, its image processor and a processor, built locally.

The same recipe as the text model (``arealite.demo.tiny``; the spec, tokenizer and saving
are ``tiny_spec`` and ``tiny_tokenizer``): a config with random weights
(text decoder with head_dim 32 and untied embeddings, a two-block vision tower with 8-pixel
patches), the locally trained tokenizer with Qwen2-VL's vision tokens, and Qwen2-VL's image
processor configured for small images (a 64 x 64 image is 8 x 8 patches, 16 image tokens after
the 2 x 2 merge). The directory loads with ``AutoModelForImageTextToText`` and
``AutoImageProcessor``, and with ``AutoProcessor`` where torchvision is installed.

``arealite.engine.vision_processor.load_processor`` loads its processor, as any other
vision-language model's.
"""

from __future__ import annotations

from pathlib import Path

from arealite.demo.tiny_spec import TinyModelSpec, save_random_model
from arealite.demo.tiny_tokenizer import (
    IMAGE_PAD,
    VIDEO_PAD,
    VISION_END,
    VISION_START,
    build_tokenizer,
)

PATCH_SIZE = 8
MERGE_SIZE = 2
# pixel bounds of the resized image: 32x32 .. 64x64 (16..64 patches, 4..16 image tokens)
MIN_PIXELS, MAX_PIXELS = 32 * 32, 64 * 64

# Qwen2-VL's chat template for plain chats: a message's content is a string or a list of
# parts; an image part renders as <|vision_start|><|image_pad|><|vision_end|>, which the
# processor then expands to one <|image_pad|> per merged patch.
VL_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or 'image' in part %}"
    "{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def image_processor():
    """Qwen2-VL's image processor (the PIL backend: no torchvision needed) for tiny images."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    return Qwen2VLImageProcessorPil(
        patch_size=PATCH_SIZE, merge_size=MERGE_SIZE, temporal_patch_size=2,
        size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
    )


def build_tiny_vl_model(out_dir: str | Path, spec: TinyModelSpec) -> Path:
    """Tokenizer (with vision tokens) + image processor + random Qwen2-VL into ``out_dir``."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(out, spec)
    tok.chat_template = VL_CHAT_TEMPLATE
    tok.save_pretrained(str(out))
    head_dim = spec.hidden_size // spec.num_attention_heads
    half = head_dim // 2  # M-RoPE splits the rotary half-dimension over (t, h, w)
    section = [half - 2 * (half * 3 // 8), half * 3 // 8, half * 3 // 8]
    ids = {t: tok.convert_tokens_to_ids(t) for t in (IMAGE_PAD, VIDEO_PAD, VISION_START, VISION_END)}
    config = Qwen2VLConfig(
        text_config=dict(
            vocab_size=len(tok), hidden_size=spec.hidden_size,
            intermediate_size=spec.intermediate_size, num_hidden_layers=spec.num_hidden_layers,
            num_attention_heads=spec.num_attention_heads,
            num_key_value_heads=spec.num_key_value_heads,
            max_position_embeddings=spec.max_position_embeddings,
            rope_scaling={"type": "mrope", "mrope_section": section},
            tie_word_embeddings=spec.tie_word_embeddings,
            bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        ),
        vision_config=dict(
            depth=2, embed_dim=64, num_heads=2, mlp_ratio=2, hidden_size=spec.hidden_size,
            patch_size=PATCH_SIZE, spatial_merge_size=MERGE_SIZE, temporal_patch_size=2,
            in_channels=3,
        ),
        image_token_id=ids[IMAGE_PAD], video_token_id=ids[VIDEO_PAD],
        vision_start_token_id=ids[VISION_START], vision_end_token_id=ids[VISION_END],
        tie_word_embeddings=spec.tie_word_embeddings,
        bos_token_id=None, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        torch_dtype="float32",
    )
    # the processor is its two halves on disk (ProcessorMixin.save_pretrained needs the video
    # processor); the tokenizer carries the chat template
    image_processor().save_pretrained(str(out))
    return save_random_model(out, Qwen2VLForConditionalGeneration, config, tok, spec)
