"""The phases of one RL step over fake engines: which rollout call each mode makes, where the
co-located switches sit, and that a weight sync is one push between pause and resume."""

from __future__ import annotations

import pytest

from arealite.api.config.rollout import GenerationHyperparameters
from arealite.api.config.weights import ConsistencyGateConfig
from arealite.api.trajectory import concat_padded_tensors
from arealite.rollout.dynamic_sampling import GroupRewardFilter
from arealite.trainer import rl_engines
from arealite.trainer.rl_engines import (
    eval_rollout_config,
    gate_after_push,
    ppo_update,
    prepare_logp_and_advantages,
    rollout_batch,
    sync_weights,
)
from arealite.weights.consistency_gate import ConsistencyGate
from tests.support.fake_rl_engines import (
    FakeActor,
    FakeRollout,
    fake_engines,
    grpo_config,
    trajectories,
)


class Switches:
    """``ColocatedPhases``' four switches, recorded."""

    def __init__(self, calls: list[tuple], ref: FakeActor | None = None) -> None:
        self.calls, self.ref = calls, ref

    def offload_actor(self) -> None:
        self.calls.append(("colocate", "offload_actor"))

    def release(self) -> None:
        self.calls.append(("colocate", "release"))

    def resume(self) -> None:
        self.calls.append(("colocate", "resume"))

    def ref_logp(self, batch: dict):
        self.calls.append(("colocate", "onload_ref"))
        return self.ref.compute_logp(batch)


@pytest.mark.parametrize("async_training", [True, False])
def test_each_mode_makes_its_one_rollout_call(tmp_path, async_training):
    calls: list[tuple] = []
    keep = GroupRewardFilter()
    e = fake_engines(grpo_config(tmp_path, f"async_training={str(async_training).lower()}"), calls)
    rollout_batch(e)
    if async_training:  # the executor draws from the loader itself, filtered by should_accept
        e.keep = keep
        rollout_batch(e)
        assert calls == [("rollout", "prepare_batch", None), ("rollout", "prepare_batch", keep)]
    else:  # the loader's next rows, through the data cycle
        rollout_batch(e)
        assert calls == [("rollout", "rollout_batch", [0, 1]), ("rollout", "rollout_batch", [2, 3])]


def test_sync_dynamic_sampling_draws_until_the_batch_is_full(tmp_path):
    class GroupPerRow(FakeRollout):  # as the executor: should_accept on each episode
        def rollout_batch(self, rows, workflow, should_accept=None):
            self._call("rollout_batch", [r["id"] for r in rows])
            groups = [trajectories(3) for _ in rows]
            for row, group in zip(rows, groups):
                group["rewards"][0] = 1 - row["id"] % 2  # odd ids: rewards that differ
            kept = [g for g in groups if should_accept(g)]
            return concat_padded_tensors(kept) if kept else {}

    calls: list[tuple] = []
    config = grpo_config(tmp_path, "rollout.consumer_batch_size=2", "actor.group_size=3",
                         "gconfig.n_samples=3")
    e = fake_engines(config, calls, rollout=GroupPerRow(calls), keep=GroupRewardFilter())
    batch = rollout_batch(e)
    assert batch["rewards"].shape[0] == 2 * 3
    # two groups missing: rows 0 (equal rewards, dropped) and 1; then one: row 2 (dropped), 3
    assert calls == [("rollout", "rollout_batch", [0, 1]), ("rollout", "rollout_batch", [2]),
                     ("rollout", "rollout_batch", [3])]


def test_colocated_switches_surround_generation_ref_logp_and_the_push(tmp_path):
    calls: list[tuple] = []
    config = grpo_config(tmp_path)
    e = fake_engines(config, calls)
    e.ref = FakeActor(calls)
    e.colocated = Switches(calls, e.ref)
    batch = rollout_batch(e)
    prepare_logp_and_advantages(e, batch)
    assert ppo_update(e, batch) == {"actor/loss": 0.0}
    sync_weights(e, version=1)
    assert calls == [
        ("colocate", "offload_actor"), ("rollout", "rollout_batch", [0, 1]), ("colocate", "release"),
        ("actor", "prepare_prox_logp"), ("colocate", "onload_ref"), ("ref", "compute_logp"),
        ("actor", "compute_advantages"), ("actor", "ppo_update"),
        # the servers get their memory back, then one push between pause and resume
        ("colocate", "resume"), ("rollout", "pause"), ("rollout", "update_weights", 1),
        ("actor", "upload_weights", 1), ("rollout", "set_version", 1), ("rollout", "resume")]
    assert "ref_logp" in batch


def test_the_evaluation_client_runs_every_held_out_prompt_at_once(tmp_path):
    """Left to the training client's default (the consumer batch size) 200 held-out prompts ran
    4 at a time; the evaluation client has every prompt in flight unless the evaluator says
    otherwise, and no staleness bound."""
    config = grpo_config(tmp_path, "rollout.consumer_batch_size=4", "rollout.max_concurrent_rollouts=8")
    ev = eval_rollout_config(config, 200)
    assert ev.max_concurrent_rollouts == 200 and ev.max_head_offpolicyness >= 1 << 20
    assert ev.consumer_batch_size == 4 and config.rollout.max_concurrent_rollouts == 8  # a copy
    assert eval_rollout_config(grpo_config(tmp_path, "evaluator.max_prompts=50"), 200).max_concurrent_rollouts == 50
    assert eval_rollout_config(grpo_config(tmp_path, "evaluator.max_concurrent=16"), 200).max_concurrent_rollouts == 16
    assert eval_rollout_config(config, 0).max_concurrent_rollouts == 1  # no held-out set: still valid


def test_the_consistency_gate_is_a_phase_of_its_own_after_every_nth_push(tmp_path, monkeypatch):
    calls: list[tuple] = []
    e = fake_engines(grpo_config(tmp_path), calls)
    checked: list[int] = []
    monkeypatch.setattr(rl_engines, "check_consistency", lambda e, version: checked.append(version))
    e.gate = ConsistencyGate(ConsistencyGateConfig(every=2), [[1, 2]], GenerationHyperparameters(),
                             1.0, 0)
    for version in (1, 2, 3, 4):
        sync_weights(e, version)
        assert len(checked) == (version - 1) // 2  # the push alone never checks
        gate_after_push(e, version)
    assert checked == [2, 4]
    e.gate = None  # the gate off: the phase does nothing
    gate_after_push(e, 5)
    assert checked == [2, 4]
