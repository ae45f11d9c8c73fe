"""The run context kept with a benchmark's figures: the load sampled during the run."""

from __future__ import annotations


def test_the_load_watch_samples_while_the_run_goes_on(monkeypatch):
    """The load average is read at the start, every ``every`` seconds, and at the end."""
    import itertools
    import time

    from benchmarks.harness import run_context

    loads = itertools.count(1.0)
    monkeypatch.setattr(run_context.os, "getloadavg", lambda: (next(loads), 0.0, 0.0))
    with run_context.LoadWatch(every=0.01) as watch:
        time.sleep(0.2)
    n = len(watch.samples)
    assert n >= 4 and watch.samples == [float(i) for i in range(1, n + 1)]
    assert watch.summary() == {"mean": round((n + 1) / 2, 2), "max": float(n), "samples": n}
