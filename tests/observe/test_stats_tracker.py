import math
from pathlib import Path

import pytest
import torch

from arealite.observe import stats_tracker
from arealite.observe.stats_tracker import ReduceType, StatsTracker


def _reference(values: list[torch.Tensor], masks: list[torch.Tensor]) -> tuple[float, float, float]:
    """Slow loop: every masked element of every call counts once."""
    picked = []
    for v, m in zip(values, masks):
        for x, keep in zip(v.flatten().tolist(), m.flatten().tolist()):
            if keep:
                picked.append(x)
    return sum(picked) / len(picked), min(picked), max(picked)


def test_masked_stats_match_reference_loop():
    g = torch.Generator().manual_seed(0)
    t = StatsTracker()
    values, masks = [], []
    for n in (3, 7, 1):  # micro-batches with different token counts
        v = torch.randn(2, n, generator=g)
        m = torch.rand(2, n, generator=g) > 0.4
        m[0, 0] = True
        values.append(v)
        masks.append(m)
        with t.scope("actor"):
            t.denominator(n_tokens=m)
            t.stat(denominator="n_tokens", kl=v)
    avg, lo, hi = _reference(values, masks)
    out = t.export()
    assert out["actor/kl/avg"] == pytest.approx(avg, abs=1e-12)
    assert out["actor/kl/min"] == pytest.approx(lo)
    assert out["actor/kl/max"] == pytest.approx(hi)
    assert out["actor/n_tokens"] == sum(int(m.sum()) for m in masks)
    assert t.export() == {}  # export resets


def test_scalar_reduce_types_and_nested_scopes():
    t = StatsTracker()
    with t.scope("a"), t.scope("b"):
        t.scalar(lr=1.0)
        t.scalar(lr=3.0)
        t.scalar(reduce_type=ReduceType.SUM, rejected=2)
        t.scalar(reduce_type=ReduceType.SUM, rejected=5)
        t.scalar(reduce_type=ReduceType.MAX, peak=torch.tensor(4.0))
        t.scalar(reduce_type=ReduceType.MAX, peak=1.0)
        t.scalar(reduce_type=ReduceType.MIN, low=4.0)
        t.scalar(reduce_type=ReduceType.MIN, low=-1.0)
        t.scalar(reduce_type=ReduceType.SUM_PER_RANK, secs=0.5)
        t.scalar(reduce_type=ReduceType.SUM_PER_RANK, secs=0.25)
    assert t.export() == {"a/b/lr": 2.0, "a/b/rejected": 7.0, "a/b/peak": 4.0,
                          "a/b/low": -1.0, "a/b/secs": 0.75}


def test_stat_with_avg_only_and_empty_mask_is_left_out():
    t = StatsTracker()
    m = torch.zeros(4, dtype=torch.bool)
    t.denominator(none=m)
    t.stat(denominator="none", x=torch.ones(4))
    t.denominator(some=torch.tensor([True, False, True, False]))
    t.stat(denominator="some", reduce_type=ReduceType.AVG, y=torch.tensor([1.0, 9.0, 3.0, 9.0]))
    out = t.export()
    assert "x/avg" not in out and out["none"] == 0.0
    assert out["y"] == 2.0


@pytest.mark.parametrize(
    "call, err",
    [
        (lambda t: t.stat(denominator="missing", x=torch.ones(2)), KeyError),
        (lambda t: t.denominator(m=torch.ones(2)), TypeError),
        (lambda t: (t.denominator(m=torch.ones(2, dtype=torch.bool)),
                    t.stat(denominator="m", x=torch.ones(3))), ValueError),
        (lambda t: (t.denominator(m=torch.ones(2, dtype=torch.bool)),
                    t.stat(denominator="m", x=[1.0, 2.0])), TypeError),
        (lambda t: t.scalar(**{"a/b": 1.0}), ValueError),
        (lambda t: (t.scalar(x=1.0), t.scalar(reduce_type=ReduceType.SUM, x=1.0)), ValueError),
    ],
)
def test_bad_input_is_a_clear_error(call, err):
    with pytest.raises(err):
        call(StatsTracker())


def test_module_level_default_tracker_and_named_trackers():
    stats_tracker.DEFAULT_TRACKER.reset()
    with stats_tracker.scope("s"):
        stats_tracker.scalar(v=1.5)
    assert stats_tracker.export() == {"s/v": 1.5}
    a = stats_tracker.get_tracker("eval")
    assert a is stats_tracker.get_tracker("eval") and a is not stats_tracker.DEFAULT_TRACKER
    assert stats_tracker.get_tracker() is stats_tracker.DEFAULT_TRACKER


def test_values_never_nan_when_mask_selects_finite_entries():
    t = StatsTracker()
    m = torch.tensor([True, False])
    t.denominator(m=m)
    t.stat(denominator="m", x=torch.tensor([1.0, math.inf]))
    assert t.export()["x/max"] == 1.0


@pytest.mark.integration
def test_all_reduce_across_two_gloo_ranks(tmp_path):
    """Ranks with different token counts combine as one pool (sum of sums / sum of counts)."""
    import json

    from tests.support.procs import run_gloo_peers
    from tests.support.stats_tracker_peer import expected

    outs = run_gloo_peers(Path(__file__).resolve().parents[1] / "support" / "stats_tracker_peer.py", tmp_path)

    results = [json.loads(o.read_text()) for o in outs]
    assert results[0] == results[1]  # every rank gets the same reduced values
    exp = expected(2)
    assert set(results[0]) == set(exp)
    for k, v in exp.items():
        assert results[0][k] == pytest.approx(v, abs=1e-12), k


def test_count_values_is_a_histogram():
    t = StatsTracker()
    with t.scope("rollout"):
        t.count_values("staleness", torch.tensor([0, 1, 1, 2]))
        t.count_values("staleness", [1, -1])
    assert t.export() == {"rollout/staleness/-1": 1.0, "rollout/staleness/0": 1.0,
                          "rollout/staleness/1": 3.0, "rollout/staleness/2": 1.0}
    with pytest.raises(TypeError):
        t.count_values("x", torch.tensor([0.5]))
