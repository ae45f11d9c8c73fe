"""Resuming the data stream from a recovery checkpoint: ``DataCycle`` (epochs, set_epoch,
replay) over a real ``StatefulDataLoader``, and the executor's in-flight rows, which the
loader's saved state is already past."""

from __future__ import annotations

import asyncio

import pytest
import torch

from arealite.api.config.dataset import DatasetConfig
from arealite.api.config.rollout import InferenceEngineConfig
from arealite.api.workflow_api import RolloutWorkflow
from arealite.dataset.loader import create_dataloader
from arealite.rollout.data_cycle import DataCycle
from arealite.rollout.executor import WorkflowExecutor

ROWS = [{"id": i} for i in range(12)]
CFG = DatasetConfig(path="unused.jsonl", batch_size=4, shuffle=True)


def ids(rows) -> list[int]:
    return [r["id"] for r in rows]


def loader():
    return create_dataloader(ROWS, CFG, seed=7)


def test_each_epoch_has_its_own_shuffle():
    dc, dl = DataCycle(), loader()
    epochs = [sum((ids(dc.next_rows(dl)) for _ in range(3)), []) for _ in range(3)]
    assert all(sorted(e) == list(range(12)) for e in epochs)
    assert len({tuple(e) for e in epochs}) == 3  # set_epoch was called: three permutations
    assert dc.epoch == 2 and dc.epochs_started == 3


@pytest.mark.parametrize("k", range(1, 9))
def test_resume_after_k_batches_matches_an_uninterrupted_walk(k):
    dc, dl = DataCycle(), loader()
    reference = [ids(dc.next_rows(dl)) for _ in range(10)]

    dc, dl = DataCycle(), loader()
    first = [ids(dc.next_rows(dl)) for _ in range(k)]
    loader_state, cycle_state = dl.state_dict(), dc.state_dict()  # the state after batch k
    dc2, dl2 = DataCycle(), loader()
    dl2.load_state_dict(loader_state)
    dc2.load_state_dict(cycle_state)
    rest = [ids(dc2.next_rows(dl2)) for _ in range(10 - k)]
    assert first + rest == reference  # k = 3, 6: checkpoints at an epoch's end


def test_replayed_rows_come_first_in_loader_sized_chunks():
    dc, dl = DataCycle(), loader()
    dc.load_state_dict({"epoch": 1, "replay": [{"id": 100 + i} for i in range(6)]})
    assert dc.replay_rows() == [{"id": 100 + i} for i in range(6)]
    assert ids(dc.next_rows(dl)) == [100, 101, 102, 103]
    state = dc.state_dict([({"id": 50}, 2, 0)])  # an in-flight row of epoch 0, 2 attempts made
    assert state["epoch"] == 1 and state["replay"] == [{"id": 50}, {"id": 104}, {"id": 105}]
    assert state["replay_tags"] == [[2, 0], [0, 1], [0, 1]]  # a plain replayed row: the epoch's
    assert ids(dc.next_rows(dl)) == [104, 105]
    dl.sampler.set_epoch(1)
    assert ids(dc.next_rows(dl)) == ids(next(iter(dl)))  # then epoch 1 of the loader


def test_bad_state_is_refused():
    with pytest.raises(ValueError, match="epoch"):
        DataCycle().load_state_dict({"epoch": -1})


class SlowEcho(RolloutWorkflow):
    async def arun_episode(self, engine, data):
        await asyncio.sleep(0.02 * (1 + data["id"] % 4))  # completion order != submission order
        return {"input_ids": torch.full((1, 2), data["id"]), "sample_ids": torch.tensor([data["id"]])}


def make_executor() -> WorkflowExecutor:
    # eta is large so that no trajectory is dropped as stale (a counted loss, by design)
    ex = WorkflowExecutor(InferenceEngineConfig(
        consumer_batch_size=4, max_head_offpolicyness=8, max_concurrent_rollouts=6,
        request_timeout=20.0), engine=None)
    ex.initialize()
    return ex


def train(ex: WorkflowExecutor, dl, steps: int, version: int) -> list[int]:
    """What the trainer does per step: a batch, then the next weight version."""
    got = []
    for _ in range(steps):
        got += ex.prepare_batch(dl, SlowEcho())["sample_ids"].tolist()
        version += 1
        ex.set_version(version)
    return got


def test_inflight_rows_are_saved_and_resubmitted_first():
    rows = [{"id": i} for i in range(60)]  # one epoch is more than the run reads
    cfg = CFG.model_copy(update={"shuffle": False})
    ex, dl = make_executor(), create_dataloader(rows, cfg, seed=0)
    try:
        before = train(ex, dl, 2, 0)
        state, loader_state = ex.data_state(), dl.state_dict()
        inflight = ids(ex.inflight_data())
    finally:
        ex.destroy()
    # Everything the loader gave out is either trained or in flight, exactly once.
    pulled = loader_state["_num_yielded"] * cfg.batch_size
    assert inflight and ids(state["replay"]) == inflight and state["epoch"] == 0
    assert sorted(before + inflight) == list(range(pulled))

    ex2, dl2 = make_executor(), create_dataloader(rows, cfg, seed=0)
    dl2.load_state_dict(loader_state)
    ex2.load_data_state(state)
    ex2.restore(2)
    try:
        assert ids(ex2.inflight_data()) == inflight  # waiting for replay
        after = train(ex2, dl2, 8, 2)
        still = ids(ex2.inflight_data())
        counters = ex2.counters()
        pulled = dl2.state_dict()["_num_yielded"] * cfg.batch_size
    finally:
        ex2.destroy()
    assert counters["stale"] == 0
    assert set(inflight) <= set(after)  # the replayed rows were trained after the restart
    # Across the restart: nothing lost, nothing twice.
    assert sorted(before + after + still) == list(range(pulled)), (before, after, still, counters)
