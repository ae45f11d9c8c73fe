"""The reward-model benchmark's overlap measure (the benchmark itself runs in `make bench`)."""

from __future__ import annotations

import asyncio

import pytest

from benchmarks.studies.reward_model import _Timed, overlap_share


def test_overlap_share_counts_the_scoring_time_inside_generation():
    gen = [(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)]  # union [0, 3] and [5, 6]
    assert overlap_share([(2.0, 4.0)], gen) == pytest.approx(0.5)
    assert overlap_share([(2.0, 4.0), (5.5, 6.5)], gen) == pytest.approx(1.5 / 3.0)
    assert overlap_share([(3.0, 5.0)], gen) == 0.0 and overlap_share([], gen) == 0.0


def test_timed_records_only_its_method():
    class Engine:
        name = "e"

        async def agenerate(self, x):
            await asyncio.sleep(0.01)
            return x + 1

    spans: list = []
    eng = _Timed(Engine(), "agenerate", spans)
    assert asyncio.run(eng.agenerate(1)) == 2 and eng.name == "e"
    assert len(spans) == 1 and spans[0][1] - spans[0][0] >= 0.009
