"""DAPO dynamic sampling: the group filter as the executor's ``should_accept`` (prepare_batch
keeps drawing until the batch is full) and the synchronous draw-until-full loop."""

from __future__ import annotations

import pytest
import torch

from arealite.api.config.dataset import DatasetConfig
from arealite.api.workflow_api import RolloutWorkflow
from arealite.dataset.loader import create_dataloader
from arealite.rollout.dynamic_sampling import GroupRewardFilter, rollout_full_batch
from tests.rollout.test_executor import executors  # noqa: F401 (fixture)

G = 3


def _group(pid: int, varied: bool) -> dict[str, torch.Tensor]:
    n = 2 + pid % 3
    rewards = torch.tensor([float(pid), float(pid) + 1.0, float(pid)]) if varied else \
        torch.full((G,), 1.0)
    return {"input_ids": torch.full((G, n), pid, dtype=torch.long),
            "attention_mask": torch.ones(G, n, dtype=torch.bool),
            "versions": torch.zeros(G, n, dtype=torch.long), "rewards": rewards}


class GroupWorkflow(RolloutWorkflow):
    """One group of G rows per prompt; prompts with an even id get all-equal rewards."""

    async def arun_episode(self, engine, data):
        return _group(data["id"], varied=data["id"] % 2 == 1)


def test_filter_keeps_groups_with_differing_rewards_and_counts():
    f = GroupRewardFilter()
    assert f(_group(1, True)) and not f(_group(2, False)) and not f(_group(4, False))
    assert f.stats() == {"dynamic_sampling/kept_groups": 1.0,
                         "dynamic_sampling/dropped_groups": 2.0,
                         "dynamic_sampling/drop_ratio": 2 / 3}
    assert f.stats()["dynamic_sampling/kept_groups"] == 0.0  # reset after reading


def test_prepare_batch_with_the_filter_returns_full_batches_of_varied_groups(executors):  # noqa: F811
    rows = [{"id": i} for i in range(12)]
    loader = create_dataloader(rows, DatasetConfig(batch_size=4, shuffle=False, drop_last=True))
    ex = executors(b=4, eta=4, m=8)
    keep = GroupRewardFilter()
    ids = []
    for step in range(2):
        batch = ex.prepare_batch(loader, GroupWorkflow(), should_accept=keep)
        assert batch["rewards"].shape[0] == 4 * G  # full: 4 groups
        r = batch["rewards"].reshape(4, G)
        assert ((r.max(1).values - r.min(1).values) > 0).all()
        ids += batch["input_ids"][::G, 0].tolist()
        ex.set_version(step + 1)
    assert len(ids) == 8 and all(i % 2 == 1 for i in ids)  # 6 odd prompts: a second epoch
    st = keep.stats()
    assert st["dynamic_sampling/kept_groups"] >= 8 and st["dynamic_sampling/dropped_groups"] >= 7


def test_rollout_full_batch_draws_until_full_and_trims():
    from arealite.api.trajectory import concat_padded_tensors

    ids = iter(range(100))
    calls = []

    def rollout(rows, accept):  # as the executor: should_accept on each episode, in order
        calls.append(rows)
        groups = [g for g in (_group(r, varied=r % 3 == 0) for r in rows) if accept(g)]
        return concat_padded_tensors(groups) if groups else {}

    keep = GroupRewardFilter()
    batch = rollout_full_batch(rollout, lambda: [next(ids) for _ in range(4)], keep, 3, G)
    assert batch["rewards"].shape[0] == 3 * G
    assert batch["input_ids"][::G, 0].tolist() == [0, 3, 6]
    # each draw asks for the groups still missing: 0..2 keeps 0, 3..4 keeps 3, 5 none, 6 the last
    assert calls == [[0, 1, 2], [3, 4], [5], [6]]
    assert keep.stats()["dynamic_sampling/dropped_groups"] == 4.0  # 1, 2, 4, 5


def test_rollout_full_batch_gives_up_with_a_clear_error():
    def rollout(rows, accept):
        g = _group(rows[0], varied=False)
        return g if accept(g) else {}

    with pytest.raises(RuntimeError, match="0/2 groups with differing rewards after 3 draws"):
        rollout_full_batch(rollout, lambda: [0], GroupRewardFilter(), 2, G, max_draws=3)


def test_sync_dynamic_sampling_keeps_the_staleness_budget(executors):  # noqa: F811
    """Groups turned down in a synchronous draw give back their place in the staleness budget:
    with half the groups dropped, each step draws twice and step after step still runs (counted
    as accepted, the drops used up the versions ahead and a later draw waited for a version
    that never came: a real sync GRPO run hung at step 3)."""
    ex = executors(b=2, eta=0, m=8)
    ids = iter(range(1000))
    keep = GroupRewardFilter()
    for step in range(6):
        batch = rollout_full_batch(
            lambda rows, accept: ex.rollout_batch(rows, GroupWorkflow(), accept, timeout=20),
            lambda: [{"id": next(ids)} for _ in range(2)], keep, 2, G)
        assert batch["rewards"].shape[0] == 2 * G
        assert (batch["input_ids"][::G, 0] % 2 == 1).all()  # odd ids: the varied groups
        ex.set_version(step + 1)
    assert keep.stats()["dynamic_sampling/dropped_groups"] >= 6
