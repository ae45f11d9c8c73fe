"""benchmarks/studies/async_vs_sync.py in its tiniest mode: two real runs (sync and async, eta = 1)
through the launcher on the tiny model, then the table, JSON and PNG."""

from __future__ import annotations

import json
import sys

import pytest

from tests.support.procs import log_tail, spawn


@pytest.mark.integration
@pytest.mark.long
@pytest.mark.timeout(420)
def test_async_vs_sync_tiniest(tmp_path, tiny_model_dir, toy_data_dir):
    results = tmp_path / "results"
    cmd = [sys.executable, "-m", "benchmarks.studies.async_vs_sync", "--steps", "2", "--runs", "sync,async-eta1",
           "--batch-size", "4", "--tail-tokens", "16", "--eval-prompts", "8", "--profile-budgets", "",
           "--model-path", str(tiny_model_dir), "--data-dir", str(toy_data_dir),
           "--fileroot", str(tmp_path / "out"), "--results-dir", str(results), "--results-tag", "_t"]
    with spawn(cmd) as (proc, log):
        try:
            code = proc.wait(timeout=360)  # two 2-step runs: ~40 s quiet, 125 s seen at load 14
        except Exception:  # noqa: BLE001 - timeout: the context manager kills the group
            pytest.fail(f"benchmark did not finish in 360 s:\n{log_tail(log, 40)}")
        out = log_tail(log, 80)
    assert code == 0, out
    r = json.loads((results / "async_vs_sync_t.json").read_text())
    assert (results / "async_vs_sync_t.png").stat().st_size > 1000
    assert set(r["runs"]) == {"sync", "async-eta1"}
    sync, asy = r["runs"]["sync"], r["runs"]["async-eta1"]
    for run in (sync, asy):
        assert run["steps"] == 2 and run["wall_s"] > 0 and run["tokens_per_s"] > 0
        assert 0 <= run["trainer_idle"] <= 1 and 0 <= run["rollout_idle"] <= 1
        assert run["final_reward"] is not None and sum(run["staleness_hist"].values()) == pytest.approx(1.0)
    assert sync["staleness_hist"] == {"0": 1.0} and sync["speedup"] == 1.0
    assert max(int(k) for k in asy["staleness_hist"]) <= 1  # eta = 1
    # the tail really was generated: some sequence is longer than prompt + a short answer
    assert max(sync["seq_len_max"], asy["seq_len_max"]) >= 16
    assert "| sync |" in out and "| async-eta1 |" in out
    assert "(target >= 2.8x)" in out and "where the time goes" in out

    # --report-only rebuilds the same figures from the runs on disk, keeping when they ran
    with spawn([*cmd, "--report-only"]) as (proc, log):
        assert proc.wait(timeout=60) == 0, log_tail(log, 40)
    again = json.loads((results / "async_vs_sync_t.json").read_text())
    assert again["runs"] == r["runs"] and again["date"] == r["date"]
