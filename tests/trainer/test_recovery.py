"""Kill the trainer mid-run; the launcher restarts it with ``recover.mode=auto`` from the newest
recovery checkpoint. Sync mode: every step trains exactly the samples of an uninterrupted run
with the same seed. Async mode: across the restart no sample is lost or trained twice (the rows
in flight at the checkpoint are saved and resubmitted)."""

from __future__ import annotations

import contextlib
import signal
from collections import Counter
from pathlib import Path

import pytest

from arealite.api.config.dataset import DatasetConfig
from arealite.dataset.loader import create_dataloader, load_rows
from arealite.demo.toy_math import write_toy_math
from arealite.observe.sample_log import read_sample_ids
from benchmarks.harness.grpo_runs import (
    descendants,
    is_trainer_worker,
    last_step,
    launcher_cmd,
    metrics,
    run_dir,
    small_run,
    wait_exit,
    wait_until,
)
from tests.support.procs import cpu_hog, log_tail, spawn

N_SAMPLES = 2  # gconfig.n_samples: each prompt's id appears this many times per step
KILL_AFTER = 3  # SIGKILL the trainer once this step is in its metrics
SEED = 1  # configs/toy_grpo*.yaml


def run(config: str, fileroot: Path, trial: str, overrides: list[str], kill: bool) -> tuple[int, str]:
    """One launcher run; with ``kill``, SIGKILL the trainer worker after step KILL_AFTER.
    Returns (the step it was killed after, or -1; the launcher's log)."""
    killed_after = -1
    with spawn(launcher_cmd(config, fileroot, trial, overrides)) as (proc, log):
        if kill:
            wait_until(lambda: last_step(fileroot, trial) >= KILL_AFTER, proc, log, 150,
                       f"step {KILL_AFTER}", poll=0.02)
            workers = descendants(proc.pid, is_trainer_worker)
            assert len(workers) == 1, [w.cmdline() for w in workers]
            workers[0].send_signal(signal.SIGKILL)
            killed_after = last_step(fileroot, trial)
        code = wait_exit(proc, log, 150)
        text = log_tail(log, 400)
        assert code == 0, f"run {trial} failed ({code}):\n{log_tail(log, 60)}"
    return killed_after, text


def check_steps(fileroot: Path, trial: str, steps: int) -> dict[int, list[int]]:
    """Every step 1..steps logged exactly once, in metrics and in sample ids."""
    logged = [r["step"] for r in metrics(fileroot, trial) if r["step"] >= 1]
    assert logged == list(range(1, steps + 1)), logged
    ids = read_sample_ids(run_dir(fileroot, trial) / "logs" / "sample_ids.jsonl")
    assert sorted(ids) == list(range(1, steps + 1)), sorted(ids)
    return ids


@pytest.mark.integration
def test_sync_recovery_trains_the_same_samples(tmp_path, tiny_model_dir):
    # 8 prompts, 4 a step: every checkpoint (each 2 steps) falls at an epoch's end, the case
    # where the restored loader has nothing left and the next epoch's shuffle must follow.
    data = tmp_path / "data"
    write_toy_math(data, n_train=8, n_valid=4, seed=0)
    steps = 24
    over = [*small_run(tiny_model_dir, data, steps, epochs=steps // 2),
            "recover.mode=auto", "recover.freq_steps=2"]
    _, _ = run("configs/toy_grpo_sync.yaml", tmp_path / "a", "uninterrupted", over, kill=False)
    killed_after, log = run("configs/toy_grpo_sync.yaml", tmp_path / "b", "killed", over, kill=True)
    assert KILL_AFTER <= killed_after < steps - 2, "the kill came too late to test a resume"
    assert "restarting the trainer from" in log

    a = check_steps(tmp_path / "a", "uninterrupted", steps)
    b = check_steps(tmp_path / "b", "killed", steps)
    # Within a step trajectories come in completion order, so compare the step's multiset.
    for s in range(1, steps + 1):
        assert sorted(b[s]) == sorted(a[s]), (s, a[s], b[s])
    # Each epoch (2 steps) trains every prompt once, and epochs are shuffled differently.
    epochs = [a[s] + a[s + 1] for s in range(1, steps + 1, 2)]
    assert all(Counter(e) == Counter({i: N_SAMPLES for i in range(8)}) for e in epochs)
    assert len({tuple(sorted(a[s])) for s in range(1, steps + 1)}) > 2


@pytest.mark.integration
@pytest.mark.parametrize("loaded", [False, True], ids=["quiet", "cpu-hog"])
def test_async_recovery_loses_and_duplicates_nothing(tmp_path, tiny_model_dir, loaded):
    """Also with a CPU hog beside it (as when CI shares its cores): an episode that finishes
    late can then be dropped as stale, and one can fail; either way its prompt is drawn again,
    so the checks below (nothing lost, nothing twice) hold as on a quiet machine."""
    with cpu_hog(1) if loaded else contextlib.nullcontext():
        _async_recovery(tmp_path, tiny_model_dir)


def _async_recovery(tmp_path: Path, tiny_model_dir: Path) -> None:
    data = tmp_path / "data"
    write_toy_math(data, n_train=400, n_valid=4, seed=0)  # the run reads less than one epoch
    steps, eta, batch = 24, 1, 4
    over = [*small_run(tiny_model_dir, data, steps, epochs=1), "recover.mode=auto",
            "recover.freq_steps=2", f"rollout.max_head_offpolicyness={eta}",
            "rollout.max_concurrent_rollouts=4"]
    killed_after, log = run("configs/toy_grpo.yaml", tmp_path, "async", over, kill=True)
    assert KILL_AFTER <= killed_after < steps - 2, "the kill came too late to test a resume"
    assert "restarting the trainer from" in log
    ids = check_steps(tmp_path, "async", steps)
    assert max(r.get("rollout/dropped", 0) for r in metrics(tmp_path, "async")) == 0

    # The order the loader hands rows out (seed as in the config); the executor reads at most
    # `window` rows ahead of the trainer (queues of (eta + 2)·B + M, and one loader batch).
    rows = load_rows(DatasetConfig(path=str(data / "train.jsonl")))
    loader = create_dataloader(rows, DatasetConfig(path="x.jsonl", batch_size=batch, shuffle=True), SEED)
    order = [r["id"] for b in loader for r in b]
    window = 2 * max(16, (eta + 2) * batch + 4) + batch
    trained = Counter(i for s in ids.values() for i in s)
    assert all(n == N_SAMPLES for n in trained.values()), "a prompt trained twice"
    assert sum(trained.values()) == steps * batch * N_SAMPLES
    # No loss: every row handed out well before the end was trained (the rows in flight at
    # the checkpoint, positions just after step 2k·B, are within this prefix).
    assert set(order[: steps * batch - window]) <= set(trained), missing_positions(order, trained)
    assert set(trained) <= set(order[: steps * batch + window])


def missing_positions(order: list[int], trained: Counter) -> str:
    return f"missing rows at loader positions {[k for k, i in enumerate(order) if i not in trained][:20]}"
