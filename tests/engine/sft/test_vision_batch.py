"""Vision SFT batches with kept row encodings (``RowEncodings``): a row seen before is not sent
through the processor again, and the batch is the one a fresh encoding builds."""

from __future__ import annotations

import json

import pytest
import torch

from arealite.engine.sft.vision_batch import RowEncodings, build_vision_sft_batch


class CountingProcessor:
    """The processor, counting its calls (one a row encoded)."""

    def __init__(self, processor):
        self.processor = processor
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.processor(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.processor, name)


@pytest.fixture(scope="module")
def rows_and_processor(tiny_vl_model_dir, toy_vision_dir):
    from arealite.engine.vision_processor import load_processor

    rows = [json.loads(x) for x in (toy_vision_dir / "train.jsonl").read_text().splitlines()][:6]
    return rows, load_processor(tiny_vl_model_dir)


def batch(proc, rows, kept=None):
    return build_vision_sft_batch(proc, [r["question"] for r in rows], [r["images"] for r in rows],
                                  [r["answer"] for r in rows], kept)


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_kept_rows_are_not_encoded_again_and_give_the_same_batch(rows_and_processor):
    rows, proc = rows_and_processor
    fresh = batch(proc, rows)
    counting, kept = CountingProcessor(proc), RowEncodings()
    assert_same(batch(counting, rows[:4], kept), batch(proc, rows[:4]))
    assert counting.calls == 4 and len(kept.rows) == 4
    # the next epoch, another order and two new rows: only the new ones are encoded
    again = batch(counting, rows[4:] + rows[:4], kept)
    assert counting.calls == 6
    order = [4, 5, 0, 1, 2, 3]
    assert_same(again, {k: v[order] for k, v in fresh.items()})


def test_kept_pixels_stay_within_the_budget(rows_and_processor):
    rows, proc = rows_and_processor
    one = int(batch(proc, rows[:1])["pixel_values"][0].numel()) * 4  # float32 bytes of a row
    kept = RowEncodings(max_bytes=2 * one)
    counting = CountingProcessor(proc)
    first = batch(counting, rows[:3], kept)
    assert len(kept.rows) == 2 and kept.kept_bytes == 2 * one
    assert_same(batch(counting, rows[:3], kept), first)
    assert counting.calls == 4  # the third row, over the budget, is encoded each time


def test_in_memory_images_are_encoded_every_time(rows_and_processor):
    from PIL import Image

    rows, proc = rows_and_processor
    images = [[Image.open(r["images"][0]).convert("RGB")] for r in rows[:2]]
    counting, kept = CountingProcessor(proc), RowEncodings()
    args = ([r["question"] for r in rows[:2]], images, [r["answer"] for r in rows[:2]])
    a = build_vision_sft_batch(counting, *args, kept)
    b = build_vision_sft_batch(counting, *args, kept)
    assert counting.calls == 4 and not kept.rows
    assert_same(a, b)
    assert_same(a, batch(proc, rows[:2]))  # the same pixels as from their paths
