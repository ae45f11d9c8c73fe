import json
import random

from arealite.demo.toy_vision import COLOURS, draw_scene, sample_scene, write_toy_vision


def _count_colour_blobs(img, rgb) -> int:
    """Connected regions of exactly ``rgb`` (4-neighbour flood fill): one per drawn shape."""
    w, h = img.size
    px = img.load()
    seen = set()
    n = 0
    for y in range(h):
        for x in range(w):
            if (x, y) in seen or px[x, y] != rgb:
                continue
            n += 1
            stack = [(x, y)]
            while stack:
                a, b = stack.pop()
                if (a, b) in seen or not (0 <= a < w and 0 <= b < h) or px[a, b] != rgb:
                    continue
                seen.add((a, b))
                stack += [(a + 1, b), (a - 1, b), (a, b + 1), (a, b - 1)]
    return n


def test_answers_count_the_shapes_drawn():
    rng = random.Random(0)
    for _ in range(60):
        scene = sample_scene(rng)
        img = draw_scene(scene["shapes"])
        assert _count_colour_blobs(img, COLOURS[scene["colour"]]) == int(scene["answer"])


def test_splits_are_written_and_deterministic(tmp_path):
    a = write_toy_vision(tmp_path / "a", n_train=20, n_valid=10, seed=1)
    b = write_toy_vision(tmp_path / "b", n_train=20, n_valid=10, seed=1)
    train = [json.loads(x) for x in a["train"].read_text().splitlines()]
    valid = [json.loads(x) for x in a["valid"].read_text().splitlines()]
    assert len(train) == 20 and len(valid) == 10
    assert [r["answer"] for r in train] == [json.loads(x)["answer"] for x in b["train"].read_text().splitlines()]
    assert {r["question"] for r in train} <= {f"How many {c} shapes are there?" for c in COLOURS}
    for r in train + valid:
        assert r["answer"].isdigit() and len(r["images"]) == 1
    # held out: a different stream of scenes
    assert [r["answer"] for r in train[:10]] != [r["answer"] for r in valid]
