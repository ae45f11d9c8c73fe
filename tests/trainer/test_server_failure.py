"""Kill one of two servers mid-run: training goes on to the last step on the other one, no
episode is lost (requests cut by the dead server are retried on the healthy one) and weight
updates keep succeeding (the broadcast group is rebuilt over the survivor)."""

from __future__ import annotations

import contextlib
import os
import signal

import pytest

from arealite.demo.toy_math import write_toy_math
from arealite.observe.sample_log import read_sample_ids
from benchmarks.harness.grpo_runs import (
    descendants,
    is_server,
    last_step,
    launcher_cmd,
    metrics,
    run_dir,
    small_run,
    wait_exit,
    wait_until,
)
from tests.support.procs import cpu_hog, log_tail, spawn

STEPS = 16
KILL_AFTER = 3


def kill_process_group(pid: int) -> None:
    """SIGKILL ``pid``'s process group when it has its own (the launcher starts each part in
    one), else ``pid`` alone: never the test's or the launcher's group."""
    pgid = os.getpgid(pid)
    if pgid == pid:
        os.killpg(pgid, signal.SIGKILL)
    else:
        os.kill(pid, signal.SIGKILL)


@pytest.mark.integration
@pytest.mark.long
@pytest.mark.parametrize("loaded", [False, True], ids=["quiet", "cpu-hog"])
def test_training_survives_a_dead_server(tmp_path, tiny_model_dir, loaded):
    with cpu_hog(1) if loaded else contextlib.nullcontext():
        _survives_a_dead_server(tmp_path, tiny_model_dir, loaded)


def _survives_a_dead_server(tmp_path, tiny_model_dir, loaded: bool) -> None:
    data = tmp_path / "data"
    write_toy_math(data, n_train=200, n_valid=4, seed=0)
    over = [*small_run(tiny_model_dir, data, STEPS, epochs=1), "launcher.n_servers=2",
            "launcher.max_server_failures=1", "rollout.max_concurrent_rollouts=8",
            "weight_update.type=distributed"]
    trial = "server-failure"
    with spawn(launcher_cmd("configs/toy_grpo.yaml", tmp_path, trial, over)) as (proc, log):
        wait_until(lambda: last_step(tmp_path, trial) >= KILL_AFTER, proc, log, 150,
                   f"step {KILL_AFTER}", poll=0.02)
        servers = descendants(proc.pid, is_server)
        assert len(servers) == 2, [s.cmdline() for s in servers]
        victim = servers[1]
        port = victim.cmdline()[victim.cmdline().index("--port") + 1]
        kill_process_group(victim.pid)
        killed_after = last_step(tmp_path, trial)
        code = wait_exit(proc, log, 150)
        out = log_tail(log, 400)
        assert code == 0, f"the run failed after a server died ({code}):\n{log_tail(log, 80)}"
    assert killed_after < STEPS - 2, "the server died too late to test anything"
    assert "continuing on the other servers" in out

    rows = [r for r in metrics(tmp_path, trial) if r["step"] >= 1]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    # No episode lost: every step trained a full batch of 4 prompts x 2, nothing was given up
    # on, and on a quiet machine nothing even failed (cut requests were retried elsewhere).
    assert max(r["rollout/dropped"] for r in rows) == 0
    if not loaded:
        assert max(r["rollout/failed"] for r in rows) == 0
    ids = read_sample_ids(run_dir(tmp_path, trial) / "logs" / "sample_ids.jsonl")
    assert all(len(ids[s]) == 8 for s in range(1, STEPS + 1))
    # Weight updates kept succeeding: one per step, the version reaching the last step.
    assert all(r["timeperf/weight_sync"] > 0 for r in rows)
    assert rows[-1]["rollout/version"] == STEPS
    trainer_log = (run_dir(tmp_path, trial) / "logs" / "trainer.log").read_text()
    assert "building a new group" in trainer_log and port in trainer_log
