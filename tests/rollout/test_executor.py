"""WorkflowExecutor with workflows that do not touch the network: the gate's exact queue
sizes, counters, failures, backpressure, pause/resume, wait/rollout_batch/prepare_batch."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
import torch

from arealite.api.config.dataset import DatasetConfig
from arealite.api.config.rollout import InferenceEngineConfig
from arealite.api.workflow_api import RolloutWorkflow
from arealite.dataset.loader import create_dataloader
from arealite.rollout.executor import (
    RolloutFailing,
    RolloutQueueFull,
    RolloutTimeout,
    WorkflowExecutor,
)


class EchoWorkflow(RolloutWorkflow):
    """One row per episode: ``input_ids`` of length 1 + id % 3 filled with the id."""

    def __init__(self, delay: float = 0.0, reject=lambda d: False, fail=lambda d: False):
        self.delay, self.reject, self.fail = delay, reject, fail
        self.seen: list[int] = []

    async def arun_episode(self, engine, data):
        if self.delay:
            await asyncio.sleep(self.delay)
        self.seen.append(data["id"])
        if self.fail(data):
            raise ZeroDivisionError(f"boom on {data['id']}")
        if self.reject(data):
            return None
        n = 1 + data["id"] % 3
        return {
            "input_ids": torch.full((1, n), data["id"], dtype=torch.long),
            "attention_mask": torch.ones(1, n, dtype=torch.bool),
            "versions": torch.zeros(1, n, dtype=torch.long),
            "rewards": torch.tensor([float(data["id"])]),
        }


def make(b=4, eta=0, m=None, queue_size=None, timeout=10.0) -> WorkflowExecutor:
    cfg = InferenceEngineConfig(
        consumer_batch_size=b, max_head_offpolicyness=eta, max_concurrent_rollouts=m,
        queue_size=queue_size, request_timeout=timeout,
    )
    ex = WorkflowExecutor(cfg, engine=None)
    ex.initialize()
    return ex


@pytest.fixture
def executors():
    made = []

    def factory(**kw):
        ex = make(**kw)
        made.append(ex)
        return ex

    yield factory
    for ex in made:
        ex.destroy()


def settle(ex: WorkflowExecutor, cond, timeout=5.0) -> dict:
    """Poll the counters until ``cond(counters)`` holds and stays so for a moment."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        c = ex.counters()
        if cond(c):
            time.sleep(0.05)
            c2 = ex.counters()
            if cond(c2) and c2 == c:
                return c
        time.sleep(0.01)
    raise AssertionError(f"counters never satisfied the condition: {ex.counters()}")


@pytest.mark.parametrize("eta", [0, 1, 3])
def test_gate_exact_queue_sizes(executors, eta):
    b = 4
    ex = executors(b=b, eta=eta, m=100)
    wf = EchoWorkflow()
    for i in range(2 * b):
        ex.submit({"id": i}, wf)
    c = settle(ex, lambda c: c["running"] == 0 and c["accepted"] == min(2 * b, b * (eta + 1)))
    assert c["pending"] == 2 * b - c["accepted"]
    ex.set_version(1)
    for i in range(2 * b, 4 * b):
        ex.submit({"id": i}, wf)
    c = settle(ex, lambda c: c["running"] == 0 and c["accepted"] == min(4 * b, b * (eta + 2)))
    assert c["pending"] == 4 * b - c["accepted"]
    assert c["submitted"] == 4 * b


def test_concurrency_bound(executors):
    ex = executors(b=8, eta=4, m=3)
    wf = EchoWorkflow(delay=0.2)
    for i in range(8):
        ex.submit({"id": i}, wf)
    c = settle(ex, lambda c: c["running"] == 3, timeout=2)
    assert c["pending"] == 5
    out = ex.wait(8, timeout=10)
    assert out["input_ids"].shape[0] == 8


def test_wait_concatenates_pads_and_times_out_without_losing(executors):
    ex = executors(b=3, eta=1)
    wf = EchoWorkflow()
    for i in range(3):
        ex.submit({"id": i}, wf)
    with pytest.raises(RolloutTimeout, match="accepted=3"):
        ex.wait(4, timeout=0.5)
    out = ex.wait(3, timeout=5)  # the three taken by the timed-out call came back
    # the workflow's keys, and the two the executor stamps (the ledger's)
    assert set(out) == {"input_ids", "attention_mask", "versions", "rewards", "episode_ids",
                        "data_epochs"}
    assert sorted(out["episode_ids"].tolist()) == [0, 1, 2]  # one serial per episode
    assert out["data_epochs"].tolist() == [-1, -1, -1]  # submitted directly: no dataloader
    assert out["input_ids"].shape == (3, 3)
    assert sorted(out["rewards"].tolist()) == [0.0, 1.0, 2.0]
    row0 = out["rewards"].tolist().index(0.0)
    assert out["versions"][row0].tolist() == [0, -1, -1]  # versions pad with -1
    assert out["attention_mask"][row0].tolist() == [True, False, False]


def test_workflow_exception_is_counted_logged_and_loop_survives(executors, caplog):
    ex = executors(b=2, eta=2)
    wf = EchoWorkflow(fail=lambda d: d["id"] == 1)
    with caplog.at_level(logging.ERROR, logger="arealite.rollout.executor"):
        for i in range(3):
            ex.submit({"id": i}, wf)
        out = ex.wait(2, timeout=5)
        settle(ex, lambda c: c["failed"] == 1)
    assert sorted(out["rewards"].tolist()) == [0.0, 2.0]
    assert "ZeroDivisionError: boom on 1" in caplog.text and "Traceback" in caplog.text
    ex.submit({"id": 5}, EchoWorkflow())  # the loop still runs
    assert ex.wait(1, timeout=5)["rewards"].tolist() == [5.0]


def test_bad_trajectory_counts_as_failure(executors):
    class Bad(RolloutWorkflow):
        async def arun_episode(self, engine, data):
            return {"x": torch.zeros(2, 3), "y": torch.zeros(3)}

    ex = executors(b=1, eta=1)
    ex.submit({"id": 0}, Bad())
    settle(ex, lambda c: c["failed"] == 1)
    with pytest.raises(TypeError):
        ex.submit({"id": 0}, object())


def test_should_accept_rejects_and_frees_budget(executors):
    b = 2
    ex = executors(b=b, eta=0)
    wf = EchoWorkflow()
    for i in range(4):
        ex.submit({"id": i}, wf)
    settle(ex, lambda c: c["accepted"] == 2 and c["running"] == 0)
    out = ex.wait(2, timeout=5, should_accept=lambda t: t["rewards"].item() >= 2)
    assert sorted(out["rewards"].tolist()) == [2.0, 3.0]
    c = ex.counters()
    assert c["rejected"] == 2 and c["accepted"] == 2


def test_workflow_returning_none_is_rejected(executors):
    ex = executors(b=4, eta=0)
    out = ex.rollout_batch(
        [{"id": i} for i in range(4)], EchoWorkflow(reject=lambda d: d["id"] % 2 == 1), timeout=5
    )
    assert sorted(out["rewards"].tolist()) == [0.0, 2.0]
    c = ex.counters()
    assert (c["accepted"], c["rejected"], c["running"]) == (2, 2, 0)


def test_stale_trajectories_are_dropped_at_consumption(executors):
    ex = executors(b=2, eta=0)
    wf = EchoWorkflow()
    for i in range(2):
        ex.submit({"id": i}, wf)
    settle(ex, lambda c: c["accepted"] == 2)
    ex.set_version(1)  # as if the trainer moved on without consuming them
    with pytest.raises(RolloutTimeout):
        ex.wait(2, timeout=0.3)
    c = ex.counters()
    assert c["stale"] == 2 and c["accepted"] == 0 and c["rejected"] == 2


def test_pause_stops_launching_and_resume_restarts(executors):
    ex = executors(b=2, eta=1)
    ex.pause()
    wf = EchoWorkflow()
    for i in range(2):
        ex.submit({"id": i}, wf)
    time.sleep(0.2)
    assert ex.counters()["pending"] == 2 and wf.seen == []
    ex.resume()
    assert ex.wait(2, timeout=5)["input_ids"].shape[0] == 2


def test_input_queue_is_bounded(executors):
    ex = executors(b=1, eta=0, queue_size=2)
    ex.pause()
    wf = EchoWorkflow()
    ex.submit({"id": 0}, wf)
    ex.submit({"id": 1}, wf)
    t0 = time.monotonic()
    with pytest.raises(RolloutQueueFull, match="pending=2"):
        ex.submit({"id": 2}, wf, timeout=0.3)
    assert 0.25 < time.monotonic() - t0 < 3


def test_output_backpressure(executors):
    ex = executors(b=8, eta=4, m=8, queue_size=3)
    wf = EchoWorkflow()
    for i in range(3):
        ex.submit({"id": i}, wf)
    settle(ex, lambda c: c["ready"] == 3)
    ex.submit({"id": 3}, wf)
    time.sleep(0.2)
    assert ex.counters()["pending"] == 1  # nothing starts until the trainer consumes
    ex.wait(1, timeout=5)
    settle(ex, lambda c: c["pending"] == 0 and c["ready"] == 3)


def test_prepare_batch_keeps_a_batch_ahead_and_cycles_epochs(executors):
    rows = [{"id": i} for i in range(6)]
    loader = create_dataloader(rows, DatasetConfig(batch_size=2, shuffle=False, drop_last=True))
    ex = executors(b=2, eta=1)
    wf = EchoWorkflow(delay=0.01)
    got = []
    for step in range(6):  # two epochs of three batches
        batch = ex.prepare_batch(loader, wf)
        assert batch["input_ids"].shape[0] == 2
        got += [int(r) for r in batch["rewards"].tolist()]
        c = ex.counters()
        assert c["pending"] + c["running"] + c["ready"] >= 2, c  # next batch already in flight
        ex.set_version(step + 1)
    assert len(got) == 12
    assert sorted(got[:6]) == list(range(6))  # first epoch: each row once (completion order)
    assert set(wf.seen) == set(range(6))


def test_restore_limits_the_first_burst(executors):
    b = 2
    ex = executors(b=b, eta=1, m=100)
    ex.restore(7)
    assert ex.get_version() == 7
    wf = EchoWorkflow()
    for i in range(10):
        ex.submit({"id": i}, wf)
    c = settle(ex, lambda c: c["running"] == 0 and c["accepted"] == 7 * b + 2 * b)
    assert c["pending"] == 10 - 2 * b


def test_restore_before_initialize_is_the_same_call():
    """No ordering rule: restore() then initialize() leaves the gate where the reverse does."""
    cfg = InferenceEngineConfig(consumer_batch_size=2, max_head_offpolicyness=1,
                                max_concurrent_rollouts=100, request_timeout=10.0)
    ex = WorkflowExecutor(cfg, engine=None)
    ex.restore(7)
    ex.initialize()
    try:
        assert ex.get_version() == 7 and ex.gate.version == 7
        assert ex.stat().accepted == 7 * 2 and ex.gate.capacity() == 2 * 2
    finally:
        ex.destroy()


def test_wait_fails_fast_when_every_episode_fails(executors):
    ex = executors(b=1, eta=30, m=50)
    wf = EchoWorkflow(fail=lambda d: True)
    for i in range(20):
        ex.submit({"id": i}, wf)
    t0 = time.monotonic()
    with pytest.raises(RolloutFailing, match="ZeroDivisionError: boom on"):
        ex.wait(1, timeout=30)
    assert time.monotonic() - t0 < 5
    settle(ex, lambda c: c["failed"] == 20)


def test_a_failed_episode_is_drawn_again_and_none_is_lost(executors):
    """A workflow that raises (a reward failed, a generation failed after all retries) costs an
    attempt, not the prompt: prepare_batch draws the row again, until it trains; a row that
    fails every time is dropped after ``episode_retries`` re-draws and counted."""
    rows = [{"id": i} for i in range(8)]
    loader = create_dataloader(rows, DatasetConfig(batch_size=2, shuffle=False, drop_last=True))
    ex = executors(b=2, eta=0)
    failed_once: set[int] = set()

    def fail(d):  # every row fails its first episode; row 5 fails every time
        first = d["id"] not in failed_once
        failed_once.add(d["id"])
        return first or d["id"] == 5

    wf = EchoWorkflow(fail=fail)
    got = []
    # 8 rows - row 5 = 7 trained, and one row of the next epoch. Row 5's last re-draw is
    # submitted by a later batch's top-up, which may come after the fourth batch when the
    # machine is slow: draw on (rows of the next epoch) until it was given up, a few at most.
    for step in range(8):
        got += [int(r) for r in ex.prepare_batch(loader, wf)["rewards"].tolist()]
        ex.set_version(step + 1)
        if step >= 3 and ex.counters()["dropped"] >= 1:
            break
    c = settle(ex, lambda c: c["dropped"] >= 1 and c["running"] == 0, timeout=30)
    # every row but 5 was trained, or is still queued (a retry can trail the next epoch's rows)
    waiting = {r["id"] for r in ex.inflight_data()}
    assert set(range(8)) - {5} <= set(got) | waiting and 5 not in got
    assert c["dropped"] >= 1 and wf.seen.count(5) >= 3  # 1 + episode_retries (2), given up
    assert c["redrawn"] >= 8 + 1  # each row once, row 5 a second time


def test_data_state_keeps_rows_waiting_to_be_drawn_again():
    from arealite.rollout.data_cycle import DataCycle

    cycle = DataCycle()
    cycle.redraw({"id": 3}, attempts=0, limit=2, epoch=1)
    cycle.redraw({"id": 4}, attempts=2, limit=2, epoch=1, reason="stale")  # out of attempts
    state = cycle.state_dict(inflight=[({"id": 9}, 0, 2)])
    assert state["replay"] == [{"id": 9}, {"id": 3}]
    assert state["replay_tags"] == [[0, 2], [1, 1]]  # (attempts, epoch) kept for the replay
    assert (cycle.redrawn, cycle.dropped, dict(cycle.dropped_by)) == (1, 1, {"stale": 1})
    # the drop waits for the ledger in the saved state, and the counters go on after a restore
    assert state["drops"] == [{"id": 4, "epoch": 1, "reason": "stale", "attempts": 3}]
    again = DataCycle()
    again.load_state_dict(state)
    assert (again.redrawn, again.dropped) == (1, 1) and again.take_dropped() == state["drops"]
    assert again.take_dropped() == []


def test_stale_drops_are_counted_and_logged_at_debug_only(executors, caplog):
    """#28: one info line per stale drop drowned the console; the count is in the stats."""
    ex = executors(b=2, eta=0)
    wf = EchoWorkflow()
    for i in range(2):
        ex.submit({"id": i}, wf)
    settle(ex, lambda c: c["accepted"] == 2)
    ex.set_version(1)
    with caplog.at_level(logging.INFO, logger="arealite.rollout.executor"):
        with pytest.raises(RolloutTimeout):
            ex.wait(2, timeout=0.3)
    assert ex.counters()["stale"] == 2
    assert not [r for r in caplog.records if "stale" in r.getMessage()]


class LenWorkflow(EchoWorkflow):
    """EchoWorkflow with a loss mask: 1 + id % 3 generated tokens."""

    async def arun_episode(self, engine, data):
        traj = await super().arun_episode(engine, data)
        traj["loss_mask"] = traj["attention_mask"].clone()
        return traj


def test_generated_side_of_the_length_bias_counts_stale_drops_too(executors):
    """#35: what was generated (stale drops included) against what was trained."""
    ex = executors(b=4, eta=0)
    wf = LenWorkflow()
    for i in range(4):
        ex.submit({"id": i}, wf)
    settle(ex, lambda c: c["accepted"] == 4)
    ex.set_version(1)  # all four are stale now: generated, never trained
    with pytest.raises(RolloutTimeout):
        ex.wait(1, timeout=0.3)
    lens, rewards = ex.take_generated()
    assert sorted(lens) == [1, 1, 2, 3] and sorted(rewards) == [0.0, 1.0, 2.0, 3.0]
    for i in (4, 5):
        ex.submit({"id": i}, wf)
    out = ex.wait(2, timeout=5)
    assert sorted(ex.take_generated()[0]) == [2, 3] and ex.take_generated() == ([], [])
    c = ex.counters()
    assert (c["gen_seqs"], c["gen_tokens"], c["trained_seqs"], c["trained_gen_tokens"]) == (6, 12, 2, 5)
    assert c["trained_tokens"] == int(out["loss_mask"].sum())


def test_a_batch_put_back_after_a_timeout_is_counted_trained_once(executors):
    """prepare_batch retries _collect every 0.5 s and a timed-out take goes back to the queue:
    its trajectories were counted as trained at every take (rollout/trained_tokens ran ahead of
    what was generated). Counted once, when the batch is returned."""
    ex = executors(b=4, eta=4)
    wf = LenWorkflow()
    for i in range(3):
        ex.submit({"id": i}, wf)
    settle(ex, lambda c: c["accepted"] == 3)
    for _ in range(3):  # three takes of three that time out and put them back
        with pytest.raises(RolloutTimeout):
            ex.wait(4, timeout=0.1)
    assert ex.counters()["trained_seqs"] == 0
    ex.submit({"id": 3}, wf)
    ex.wait(4, timeout=5)
    c = ex.counters()
    assert (c["trained_seqs"], c["gen_seqs"]) == (4, 4)
    assert c["trained_tokens"] == c["gen_tokens"] == 1 + 2 + 3 + 1


def test_drain_lets_running_episodes_finish_and_starts_no_new_one(executors):
    """#28: evaluation needs the servers free of training work: drain waits for the episodes in
    flight (pause would freeze them) and launches nothing until undrain."""
    ex = executors(b=2, eta=3, m=2)
    wf = EchoWorkflow(delay=0.3)
    for i in range(4):
        ex.submit({"id": i}, wf)
    settle(ex, lambda c: c["running"] == 2, timeout=2)
    t0 = time.monotonic()
    ex.drain(timeout=5)
    assert time.monotonic() - t0 > 0.1  # it waited for the two running episodes
    c = ex.counters()
    assert c["running"] == 0 and c["accepted"] == 2 and c["pending"] == 2
    time.sleep(0.2)
    assert ex.counters()["running"] == 0 and sorted(wf.seen) == [0, 1]
    ex.undrain()
    assert ex.wait(4, timeout=5)["input_ids"].shape[0] == 4


def test_drain_times_out_with_the_counters(executors):
    ex = executors(b=1, eta=0)
    ex.submit({"id": 0}, EchoWorkflow(delay=2.0))
    settle(ex, lambda c: c["running"] == 1, timeout=2)
    with pytest.raises(RolloutTimeout, match="drain"):
        ex.drain(timeout=0.2)
    ex.undrain()


class SlowFirstWorkflow(EchoWorkflow):
    """Episode 0 takes ``slow`` seconds; the others finish at once."""

    def __init__(self, slow: float):
        super().__init__()
        self.slow = slow

    async def arun_episode(self, engine, data):
        if data["id"] == 0:
            await asyncio.sleep(self.slow)
        return await super().arun_episode(engine, data)


def test_a_batch_waits_for_the_episode_it_is_the_last_chance_for(executors):
    """Episode 0 runs long; when the batch at version 1 is its last chance (η = 1), the batch
    keeps a place for it instead of filling up with younger ready ones: nothing goes stale."""
    ex = executors(b=2, eta=1)
    wf = SlowFirstWorkflow(slow=1.0)
    for i in range(4):  # capacity (η + 0 + 1)·B = 4: all start at version 0
        ex.submit({"id": i}, wf)
    settle(ex, lambda c: c["accepted"] == 3)
    first = ex.wait(2, timeout=5)
    assert sorted(first["rewards"].tolist()) == [1.0, 2.0]  # not its last chance yet
    ex.set_version(1)
    for i in (4, 5):  # younger episodes, ready before episode 0
        ex.submit({"id": i}, wf)
    settle(ex, lambda c: c["ready"] >= 3 or c["running"] == 0)
    second = ex.wait(2, timeout=5)
    assert sorted(second["rewards"].tolist()) == [0.0, 3.0]
    ex.set_version(2)
    third = ex.wait(2, timeout=5)
    assert sorted(third["rewards"].tolist()) == [4.0, 5.0]
    c = ex.counters()
    assert c["stale"] == 0 and c["stale_tokens"] == 0
