"""``RolloutAccounts``: serials, stale drops and tokens and lengths by fate, carried over a
restart by their saved state; the generated lengths kept for the stats stay bounded."""

from __future__ import annotations

import torch

from arealite.rollout import accounting
from arealite.rollout.accounting import RolloutAccounts


def traj(mask: list[list[int]], rewards: list[float] | None = None) -> dict[str, torch.Tensor]:
    t = {"loss_mask": torch.tensor(mask)}
    if rewards is not None:
        t["rewards"] = torch.tensor(rewards)
    return t


def test_counts_by_fate_and_a_restart_goes_on_from_them():
    a = RolloutAccounts()
    assert [a.next_serial() for _ in range(3)] == [0, 1, 2]
    two = traj([[0, 1, 1], [1, 1, 1]], [1.0, 0.0])  # 2 + 3 generated tokens
    one = traj([[1, 0, 0]], [0.5])
    a.finished(two)
    a.finished(one)
    a.dropped_stale(one)
    a.trained(two)
    assert a.take_generated() == ([2, 3, 1], [1.0, 0.0, 0.5])
    assert a.take_generated() == ([], [])  # each finished trajectory once
    state = a.state()
    assert state == {
        "episodes": 3,
        "stale": 1,
        "stale_tokens": 1,
        "trained_tokens": 5,
        "gen_seqs": 3,
        "gen_tokens": 6,
        "trained_seqs": 2,
        "trained_gen_tokens": 5,
    }
    b = RolloutAccounts()
    b.load_state(state)
    assert b.next_serial() == 3 and b.state()["stale"] == 1
    b.load_state({})  # a run saved before these counters existed starts them at 0
    assert b.state() == dict.fromkeys(state, 0)


def test_generated_lengths_nobody_takes_stay_bounded():
    a = RolloutAccounts()
    for _ in range(accounting.KEEP_GENERATED + 1):
        a.finished(traj([[1]]))
    lens, _ = a.take_generated()
    assert len(lens) == accounting.KEEP_GENERATED + 1 - accounting.KEEP_GENERATED // 2
    assert a.state()["gen_seqs"] == accounting.KEEP_GENERATED + 1  # the counts are all kept
    a.finished({"rewards": torch.tensor([1.0])})  # no mask: nothing generated to count
    assert a.take_generated() == ([], [])
