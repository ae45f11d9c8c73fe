"""Run figures of the async-vs-sync benchmark, from hand-made metrics records."""

from __future__ import annotations

import random

import pytest

from benchmarks.harness.rl_metrics import (
    compare,
    markdown_table,
    overlap_bound,
    overlap_efficiency,
    phase_table,
    reward_curve,
    summarize,
    wall_clock,
)


def _step(step, elapsed, secs, wait, tps, idle, n_tokens, hist, reward, **extra):
    r = {"step": step, "elapsed_s": elapsed, "timeperf/step": secs, "timeperf/rollout_wait": wait,
         "timeperf/logp": 0.25 * (secs - wait), "timeperf/update": 0.5 * (secs - wait),
         "timeperf/weight_sync": 0.05, "perf/tokens_per_sec": tps, "rollout/idle_s": idle,
         "n_tokens": n_tokens, "reward": reward, "gen_len": 5.0, "seq_len/max": 40.0,
         "staleness/max": max(hist)}
    r.update({f"staleness/hist_{k}": v for k, v in hist.items()})
    r.update(extra)
    return r


RECORDS = [
    {"step": 0, "elapsed_s": 1.0, "eval/score": 0.4, "eval/n": 10.0},
    _step(1, 4.0, 2.5, 1.0, 400.0, 1.5, 100, {0: 1.0}, 0.2),
    _step(2, 6.5, 2.0, 0.5, 500.0, 1.0, 300, {0: 0.5, 1: 0.5}, 0.4,
          **{"length_bias/run_mean_ratio": 0.98}),
    # the last record is written after the final evaluation: its elapsed_s is not used
    _step(3, 99.0, 2.5, 1.0, 400.0, 1.0, 100, {1: 1.0}, 0.6, **{"eval/score": 0.6}),
]


def test_summarize():
    s = summarize(RECORDS)
    assert s["steps"] == 3
    assert s["wall_s"] == pytest.approx(6.5 - 1.0 + 2.5)
    assert s["tokens"] == pytest.approx(3000.0)
    assert s["tokens_per_s"] == pytest.approx(3000.0 / 8.0)
    assert s["trainer_idle"] == pytest.approx(2.5 / 7.0)
    assert s["rollout_idle"] == pytest.approx(3.5 / 8.0)
    assert s["staleness_hist"] == pytest.approx({0: 0.5, 1: 0.5})  # weighted by n_tokens
    assert s["staleness_max"] == 1
    assert s["initial_reward"] == 0.4 and s["final_reward"] == 0.6
    assert s["train_reward_last"] == pytest.approx(0.6)
    assert s["length_ratio"] == 0.98  # the last step that has the cumulative ratio
    assert summarize(RECORDS[:2])["length_ratio"] is None
    p = s["phases"]
    assert p["step"] == pytest.approx(7.0 / 3)
    assert p["rollout_wait"] == pytest.approx(2.5 / 3)
    assert p["trainer"] == pytest.approx(4.5 / 3)
    assert p["other"] == pytest.approx(p["step"] - p["rollout_wait"] - p["logp"] - p["update"] - 0.05)


def test_wall_clock_without_an_initial_eval_and_with_one_step():
    assert wall_clock(RECORDS[1:]) == pytest.approx(6.5 + 2.5)
    assert wall_clock(RECORDS[:2]) == pytest.approx(2.5)
    with pytest.raises(ValueError):
        wall_clock(RECORDS[:1])


def test_reward_curve_times_are_step_ends():
    flat = [v for pt in reward_curve(RECORDS) for v in pt]
    assert flat == pytest.approx([2.5, 0.2, 3.0 + 2.0, 0.4, 5.5 + 2.5, 0.6])


def _pipeline_reference(g: float, t: float, n: int) -> float:
    """Slow reference: a generator producing a batch every g seconds, never blocked, and a
    trainer taking t seconds per batch once that batch exists."""
    gen_end, train_end = 0.0, 0.0
    for _ in range(n):
        gen_end += g
        train_end = max(gen_end, train_end) + t
    return train_end


def test_overlap_efficiency_matches_a_pipeline_simulation():
    rng = random.Random(0)
    for _ in range(200):
        g, t, n = rng.uniform(0.01, 3), rng.uniform(0.01, 3), rng.randint(1, 50)
        sync = {"steps": n, "wall_s": n * (g + t), "phases": {"rollout_wait": g, "trainer": t}}
        ideal = _pipeline_reference(g, t, n)
        run = {"steps": n, "wall_s": ideal * 1.25}
        assert overlap_efficiency(run, sync) == pytest.approx(1 / 1.25)
        assert overlap_bound(sync) == pytest.approx((g + t) / max(g, t))
        # the sync run itself only reaches max + min over the sum of the phases
        assert overlap_efficiency(sync, sync) == pytest.approx(ideal / (n * (g + t)))


def test_compare_and_tables():
    sync = summarize(RECORDS)
    fast = dict(sync, wall_s=sync["wall_s"] / 2, tokens_per_s=750.0, final_reward=0.58)
    worse = dict(sync, wall_s=sync["wall_s"] / 3, final_reward=0.5)
    runs = compare({"sync": sync, "async-eta2": fast, "async-eta4": worse})
    assert runs["sync"]["speedup"] == pytest.approx(1.0)
    assert runs["async-eta2"]["speedup"] == pytest.approx(2.0)
    assert runs["async-eta2"]["reward_ok"] is True  # 0.58 >= 0.95 * 0.6
    assert runs["async-eta4"]["reward_ok"] is False
    assert runs["async-eta4"]["reward_vs_sync"] == pytest.approx(0.5 / 0.6)
    md = markdown_table(runs, labels={"sync": "sync (eta=0)"})
    assert md.splitlines()[2].startswith("| sync (eta=0) | 8.0 | 1.00x | 375 |")
    assert "| async-eta2 | 4.0 | 2.00x | 750 |" in md
    assert "0:0.50 1:0.50" in md
    assert len(phase_table(runs).splitlines()) == 2 + 3
    with pytest.raises(KeyError):
        compare({"async-eta2": fast})
