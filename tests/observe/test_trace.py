"""The trace writer: lanes never hold two overlapping spans, the file is JSON trace events
(also when cut short), and the PNG renderer draws a window of steps."""

from __future__ import annotations

import json

import pytest

from arealite.observe import trace
from arealite.observe.timing import timer
from arealite.observe.trace_plot import main as plot_main
from arealite.observe.trace_plot import plot_trace


def test_lanes_and_file(tmp_path):
    tr = trace.TraceWriter(tmp_path / "t.json", rank=3)
    # spans of one kind arrive in order of their end; overlapping ones get different lanes
    spans = [(0.0, 1.0), (0.5, 2.0), (1.5, 3.0), (2.5, 2.6), (2.1, 4.0)]
    lanes = [tr.lane("call", a, b) for a, b in sorted(spans, key=lambda s: s[1])]
    placed = dict(zip(sorted(spans, key=lambda s: s[1]), lanes))
    for (a0, a1), la in placed.items():
        for (b0, b1), lb in placed.items():
            if (a0, a1) != (b0, b1) and la == lb:
                assert a1 <= b0 or b1 <= a0
    assert len(set(lanes)) == 3 and min(lanes) == trace.LANE_BASES["call"]
    for (a, b), lane in placed.items():
        tr.complete("request", "request", lane, tr.t0 + a, tr.t0 + b, {"x": 1})
    tr.flush()
    cut = trace.load_trace(tr.path)  # no closing bracket yet: still readable
    tr.close()
    full = json.loads(tr.path.read_text())
    assert cut == full and all(e["pid"] == 3 for e in full)
    xs = [e for e in full if e["ph"] == "X"]
    assert len(xs) == 5 and {e["dur"] for e in xs} >= {1e6, 1.5e6}
    names = {e["args"]["name"] for e in full if e["ph"] == "M"}
    assert "trainer rank 3" in names and "requests and reward calls 2" in names


def test_timer_spans_only_while_tracing(tmp_path):
    with timer("before"):
        pass
    tr = trace.start(tmp_path / "t.json")
    try:
        with timer("phase"):
            with timer("inner"):
                pass
    finally:
        trace.stop()
    ev = {e["name"]: e for e in trace.load_trace(tr.path) if e["ph"] == "X"}
    assert set(ev) == {"phase", "inner"} and trace.TRACER is None
    assert ev["phase"]["ts"] <= ev["inner"]["ts"] and ev["inner"]["tid"] == trace.TRAINER_TID


def test_plot_a_window_of_steps(tmp_path):
    tr = trace.TraceWriter(tmp_path / "t.json")
    t = tr.t0
    for s in range(1, 5):
        a = t + s
        tr.complete(f"step {s}", "step", trace.TRAINER_TID, a, a + 0.9, {"step": s})
        tr.complete("update", "timeperf", trace.TRAINER_TID, a + 0.5, a + 0.8)
        lane = tr.lane("episode", a, a + 0.6)
        tr.complete("episode", "episode", lane, a, a + 0.6, {"id": s, "outcome": "accepted"})
        tr.complete("queued", "queue", lane, a, a + 0.1, {"episode": s})
        rl = tr.lane("call", a + 0.1, a + 0.5)
        tr.complete("generate @ h:1", "generate", rl, a + 0.1, a + 0.5, {"server": "h:1", "episode": s})
    tr.close()
    png = plot_trace(tr.path, tmp_path / "out" / "t.png", (2, 3))
    assert png.stat().st_size > 5000
    with pytest.raises(ValueError, match="no step in 7..9"):
        plot_trace(tr.path, tmp_path / "x.png", (7, 9))
    assert plot_main([str(tr.path), str(tmp_path / "y.png"), "--steps", "1:2:3"]) == 2

