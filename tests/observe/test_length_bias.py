"""observe/length_bias.py: the KS statistic against a slow reference loop, and the step's
length-bias figures on hand-made samples."""

from __future__ import annotations

import random

import pytest

from arealite.observe.length_bias import (
    generated_lengths,
    ks_statistic,
    length_bias_stats,
    run_mean_ratio,
)


def ks_reference(a: list[float], b: list[float]) -> float:
    """sup over every sample point of |#(a <= x)/|a| - #(b <= x)/|b||, one point at a time."""
    best = 0.0
    for x in a + b:
        fa = sum(1 for v in a if v <= x) / len(a)
        fb = sum(1 for v in b if v <= x) / len(b)
        best = max(best, abs(fa - fb))
    return best


@pytest.mark.parametrize("seed", range(6))
def test_ks_matches_the_reference_loop(seed):
    rng = random.Random(seed)
    a = [rng.randint(0, 12) for _ in range(rng.randint(1, 40))]  # ties, as token counts have
    b = [rng.randint(2, 15) for _ in range(rng.randint(1, 40))]
    assert ks_statistic(a, b) == pytest.approx(ks_reference(a, b))


def test_ks_edges():
    assert ks_statistic([1, 2, 3], [1, 2, 3]) == 0.0
    assert ks_statistic([1, 2], [5, 6]) == 1.0
    assert ks_statistic([], [1]) == 0.0


def test_trained_shorter_than_generated_shows_up():
    gen = [10, 10, 20, 20, 40, 40, 80, 80]  # the long ones went stale
    trained = [10, 10, 20, 20, 40, 40]
    s = length_bias_stats(gen, [1.0] * 4 + [0.0] * 4, trained, [1.0] * 4 + [0.0] * 2)
    assert s["length_bias/mean_ratio"] == pytest.approx((140 / 6) / (300 / 8))
    assert s["length_bias/p90_ratio"] < 1.0
    assert s["length_bias/ks"] == pytest.approx(ks_reference(trained, gen))
    assert s["length_bias/reward_diff"] == pytest.approx(4 / 6 - 4 / 8)
    same = length_bias_stats(gen, [], gen, [])
    assert same["length_bias/mean_ratio"] == 1.0 and same["length_bias/ks"] == 0.0
    assert "length_bias/reward_diff" not in same
    assert length_bias_stats([], [], trained, []) == {}


def test_generated_lengths_count_what_the_policy_generated():
    import torch

    # prompt (-1), 3 generated of which 2 trained, a feedback token (-1), padding (-1)
    traj = {"versions": torch.tensor([[-1, -1, 4, 4, 5, -1, -1], [-1, 3, -1, -1, -1, -1, -1]]),
            "loss_mask": torch.tensor([[0, 0, 1, 1, 0, 0, 0], [0, 1, 0, 0, 0, 0, 0]])}
    assert generated_lengths(traj) == [3, 1]
    assert generated_lengths({"loss_mask": traj["loss_mask"]}) == [2, 1]
    assert generated_lengths({"input_ids": torch.zeros(2, 3)}) == []


def test_run_mean_ratio_from_the_counters():
    c = {"rollout/gen_seqs": 10.0, "rollout/gen_tokens": 200.0, "rollout/trained_seqs": 8.0,
         "rollout/trained_gen_tokens": 152.0}
    assert run_mean_ratio(c) == {"length_bias/run_mean_ratio": pytest.approx(19 / 20)}
    assert run_mean_ratio({}) == {}
