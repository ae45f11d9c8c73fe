"""A synthetic visual counting task drawn with Pillow: "How many <colour> shapes are there?".

Each image is a small canvas with a few filled shapes (circles, squares, triangles) in a few
colours, placed on a grid so that no two overlap; the answer is the number of shapes of the
asked colour, a digit, checkable exactly. Train and held-out splits come from different seeds.
Everything is deterministic for a given seed and written locally (PNG files plus JSONL rows
that point at them), so tests and runs never download anything.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30), "green": (30, 180, 30), "blue": (30, 60, 220),
}
SHAPES = ("circle", "square", "triangle")
# pixels per side: 4 x 4 patches of 8 pixels for the tiny model's processor, 2 x 2 image tokens
# after its 2 x 2 merge, so each cell of the grid below is exactly one image token. With 64-pixel
# scenes (a shape spread over parts of four tokens) the tiny model had not learned to look at
# the image after 1000 SFT steps; with 32 it does after about 600 (docs/vision.md).
IMAGE_SIZE = 32
GRID = 2  # shapes sit in the cells of a GRID x GRID layout (a cell: 2 x 2 patches, one token)
MAX_SHAPES = 4


def question_for(colour: str) -> str:
    return f"How many {colour} shapes are there?"


def draw_scene(shapes: list[tuple[str, str, int]], size: int = IMAGE_SIZE):
    """A PIL image of ``(shape, colour, cell)`` triples on a white background."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (size, size), (255, 255, 255))
    d = ImageDraw.Draw(img)
    cell = size // GRID
    pad = max(2, cell // 6)
    for shape, colour, idx in shapes:
        x0, y0 = (idx % GRID) * cell + pad, (idx // GRID) * cell + pad
        x1, y1 = x0 + cell - 2 * pad, y0 + cell - 2 * pad
        rgb = COLOURS[colour]
        if shape == "circle":
            d.ellipse([x0, y0, x1, y1], fill=rgb)
        elif shape == "square":
            d.rectangle([x0, y0, x1, y1], fill=rgb)
        else:
            d.polygon([((x0 + x1) // 2, y0), (x0, y1), (x1, y1)], fill=rgb)
    return img


def sample_scene(rng: random.Random) -> dict[str, Any]:
    """One scene and its question: 1..MAX_SHAPES shapes, the asked colour counted exactly."""
    n = rng.randint(1, MAX_SHAPES)
    cells = rng.sample(range(GRID * GRID), n)
    shapes = [(rng.choice(SHAPES), rng.choice(list(COLOURS)), c) for c in cells]
    colour = rng.choice(list(COLOURS))
    answer = sum(1 for _, c, _ in shapes if c == colour)
    return {"shapes": shapes, "colour": colour, "question": question_for(colour),
            "answer": str(answer)}


def generate_toy_vision(out_dir: str | Path, n: int, seed: int, split: str) -> list[dict[str, Any]]:
    """``n`` rows whose images are written under ``out_dir/images/<split>/``."""
    rng = random.Random(f"toy-vision-{split}-{seed}")
    img_dir = Path(out_dir) / "images" / split
    img_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(n):
        scene = sample_scene(rng)
        path = img_dir / f"{i:05d}.png"
        draw_scene(scene["shapes"]).save(path)
        rows.append({"id": f"{split}-{i}", "question": scene["question"], "answer": scene["answer"],
                     "images": [str(path.resolve())], "colour": scene["colour"]})
    return rows


def write_toy_vision(out_dir: str | Path, n_train: int = 2000, n_valid: int = 100,
                     seed: int = 0) -> dict[str, Path]:
    """``train.jsonl`` and ``valid.jsonl`` (held out: another seed stream) under ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, n in (("train", n_train), ("valid", n_valid)):
        rows = generate_toy_vision(out, n, seed, split)
        p = out / f"{split}.jsonl"
        p.write_text("".join(json.dumps(r) + "\n" for r in rows))
        paths[split] = p
    return paths


def corpus_texts() -> list[str]:
    """Question and answer texts for the tokenizer (so colour words are a token or two)."""
    texts = [question_for(c) for c in COLOURS]
    texts += [f"The answer is {k}." for k in range(MAX_SHAPES + 1)]
    return texts * 50
