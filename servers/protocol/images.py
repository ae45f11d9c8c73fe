"""``image_data`` of a ``/generate`` body: its shapes, and loading each item as SGLang does.

SGLang's ``GenerateReqInput.image_data`` is one item, a list of items (one prompt's images, or
one image per prompt of a batch) or a list of lists (per prompt). An item is a string: a file
path, a ``file://`` URL, a ``data:image/...;base64,`` URL, or bare base64 (SGLang's
``load_image``). ``http(s)`` URLs are refused: the embedded server never reaches out.

Every failure is a ``ValueError`` whose text names the image and the problem; the route turns
it into a 400 before anything reaches the engine, so a bad image never touches other requests.
"""

from __future__ import annotations

import base64
import binascii
import io
from pathlib import Path
from typing import Any

MAX_IMAGE_BYTES = 16 * 1024 * 1024  # an encoded image larger than this is refused
MAX_IMAGE_PIXELS = 4096 * 4096  # a decoded image larger than this is refused (decompression bombs)
MAX_IMAGES_PER_PROMPT = 16


def split_image_data(raw: Any, batch: int, is_single: bool) -> list[list[str]]:
    """Per-prompt lists of image items (empty lists where a prompt has none)."""
    if raw is None:
        return [[] for _ in range(batch)]
    if isinstance(raw, str):
        if not is_single:
            raise ValueError("image_data must be a list (one entry per prompt) for a batch")
        return [[raw]]
    if not isinstance(raw, list):
        raise ValueError(f"image_data must be a string or a list, got {type(raw).__name__}")
    if is_single:
        items = [raw]  # one prompt: its list of images
    else:
        if len(raw) != batch:
            raise ValueError(f"image_data holds {len(raw)} entries but the batch has {batch} prompts")
        items = [[] if x is None else [x] if isinstance(x, str) else x for x in raw]
    for i, group in enumerate(items):
        if not isinstance(group, list) or not all(isinstance(x, str) for x in group):
            raise ValueError(f"image_data[{i}] must be a string or a list of strings")
        if len(group) > MAX_IMAGES_PER_PROMPT:
            raise ValueError(f"image_data[{i}] holds {len(group)} images; at most "
                             f"{MAX_IMAGES_PER_PROMPT} per prompt")
    return items


def _read_bytes(item: str, where: str) -> bytes:
    if item.startswith(("http://", "https://")):
        raise ValueError(f"{where}: remote URLs are not fetched by the embedded server; "
                         "send a local path, a file:// URL or base64")
    if item.startswith("data:"):
        head, _, payload = item.partition(",")
        if ";base64" not in head:
            raise ValueError(f"{where}: a data URL must be base64-encoded")
        return _b64(payload, where)
    path = item[len("file://"):] if item.startswith("file://") else item
    looks_like_path = item.startswith(("file://", "/", "./", "../")) or (
        len(item) < 1024 and Path(path).suffix.lower() in (".png", ".jpg", ".jpeg", ".gif",
                                                           ".bmp", ".webp"))
    if looks_like_path:
        p = Path(path)
        if not p.is_file():
            raise ValueError(f"{where}: no image file at {path!r}")
        if p.stat().st_size > MAX_IMAGE_BYTES:
            raise ValueError(f"{where}: image file is {p.stat().st_size} bytes, over the "
                             f"{MAX_IMAGE_BYTES}-byte limit")
        return p.read_bytes()
    return _b64(item, where)


def _b64(payload: str, where: str) -> bytes:
    if len(payload) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise ValueError(f"{where}: base64 image is over the {MAX_IMAGE_BYTES}-byte limit")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{where}: not a file path, file:// URL, data URL or valid base64") from None


def load_image(item: str, where: str = "image"):
    """One item -> an RGB ``PIL.Image`` (ValueError naming ``where`` and the problem)."""
    from PIL import Image

    data = _read_bytes(item, where)
    if len(data) > MAX_IMAGE_BYTES:
        raise ValueError(f"{where}: image is {len(data)} bytes, over the {MAX_IMAGE_BYTES}-byte limit")
    try:
        img = Image.open(io.BytesIO(data))
        w, h = img.size
        if w * h > MAX_IMAGE_PIXELS:
            raise ValueError(f"{where}: image is {w}x{h} pixels, over the {MAX_IMAGE_PIXELS}-pixel limit")
        img.load()
    except ValueError:
        raise
    except Exception as e:  # PIL raises several types for undecodable data
        raise ValueError(f"{where}: cannot decode the image ({type(e).__name__}: {e})") from None
    return img.convert("RGB")
