"""The RL run's bookkeeping over fake engines: what follows each step (HF save, evaluation,
time budget, recovery checkpoint) and a recovery that restores every field of the checkpoint
(the launcher-level runs of ``test_recovery.py`` show the samples; this, each field)."""

from __future__ import annotations

import dataclasses

from arealite.trainer.eval_hook import TrainClock
from arealite.trainer.rl_run import recover_or_start
from arealite.utils import recover as rec
from tests.support.fake_rl_engines import fake_engines, grpo_config, trajectories

SCHEDULE = ("saver.freq_steps=2", "evaluator.freq_steps=3", "recover.freq_steps=2",
            "recover.mode=auto")


def _counters(state: dict) -> dict:
    return {k: v for k, v in state.items() if k != "secs_since_fire"}


def _steps(run, e, stop_after: int | None = None) -> list[dict]:
    out = []
    for step in range(run.start_step, e.total_steps):
        stats = {"actor/loss": 0.0}
        done = run.after_step(e, step, trajectories(version=step), stats)
        out.append(stats)
        if step == stop_after:
            break
        assert not done
    return out


def test_after_step_saves_evaluates_and_checkpoints_on_schedule(tmp_path):
    calls: list[tuple] = []
    config = grpo_config(tmp_path, *SCHEDULE)
    e = fake_engines(config, calls, steps=5)
    run = recover_or_start(config, e)
    assert run.start_step == 0
    # a fresh run: the clients start, then the initial weights are evaluated (no push)
    assert calls == [("rollout", "initialize"), ("eval", "initialize"), ("eval", "evaluate", 2)]
    calls.clear()
    stats = _steps(run, e)
    saves = [c[2:] for c in calls if c[:2] == ("actor", "save")]
    # HF every 2 steps and after the last; a recovery checkpoint (dcp) every 2 steps, after the
    # step's HF save
    assert saves == [("hf", "step2"), ("dcp", "weights"), ("hf", "step4"), ("dcp", "weights"),
                     ("hf", "step5")]
    assert [i + 1 for i, s in enumerate(stats) if "eval/score" in s] == [3, 5]  # and the last
    assert all(s["rollout/idle_ratio"] == 0.5 and "timeperf/step" in s for s in stats)
    assert rec.load_recover_info(rec.find_latest(rec.recover_root(config))).step == 3
    run.close()


def test_the_time_budget_ends_the_run_after_a_saved_evaluated_step(tmp_path):
    calls: list[tuple] = []
    config = grpo_config(tmp_path, "total_train_seconds=5", "total_train_steps=5", "saver.freq_steps=10",
                         "evaluator.freq_steps=10")
    e = fake_engines(config, calls, steps=5)
    run = recover_or_start(config, e)
    calls.clear()
    assert not run.after_step(e, 0, trajectories(), {})
    run.clock = TrainClock(already=6.0)  # the budget is used up during step 1
    stats: dict = {}
    assert run.after_step(e, 1, trajectories(), stats)
    assert ("actor", "save", "hf", "step2") in calls and "eval/score" in stats
    run.close()


def test_without_held_out_rows_the_evaluator_is_never_asked(tmp_path):
    """Its schedule is saved in the recovery checkpoint: it counts evaluations, not steps."""
    config = grpo_config(tmp_path, "evaluator.freq_steps=3", "saver.freq_steps=3")
    e = fake_engines(config, [], steps=2, valid_rows=0)
    run = recover_or_start(config, e)
    _steps(run, e)
    assert run.evaluator.state_dict()["steps"] == 0
    assert run.saver.state_dict()["steps"] == 2  # while the saver counts every step
    run.close()


def test_recovery_restores_every_field_of_the_checkpoint(tmp_path):
    config = grpo_config(tmp_path, *SCHEDULE)
    first = fake_engines(config, [], steps=5)
    run = recover_or_start(config, first)
    first.cycle.load_state_dict({"epoch": 1, "replay": [{"id": 99}]})
    first.loader.pos = 8
    run.clock = TrainClock(already=40.0)
    _steps(run, first, stop_after=3)  # killed after step 3's recovery checkpoint
    saved = rec.load_recover_info(rec.find_latest(rec.recover_root(config)))
    assert (saved.step, saved.epoch, saved.epoch_step, saved.version) == (3, 0, 3, 4)
    run.close()

    calls: list[tuple] = []
    again = fake_engines(config, calls, steps=5)
    resumed = recover_or_start(config, again)
    assert resumed.start_step == 4
    ckpt = str(rec.weights_dir(rec.find_latest(rec.recover_root(config))))
    # weights and optimizer, the version before the clients start, then the servers get the
    # checkpoint's weights (they may hold others after a crash); no initial evaluation
    # (sync mode: the executor's drops and counters are saved beside the walk's state)
    assert calls == [("actor", "load", "dcp", ckpt),
                     ("rollout", "load_data_state", {"epoch": 1, "replay": [["in flight"]]}),
                     ("rollout", "restore", 4),
                     ("rollout", "initialize"), ("eval", "initialize"),
                     ("rollout", "update_weights", 4), ("actor", "upload_weights", 4),
                     ("rollout", "set_version", 4)]
    assert again.loader.state_dict() == saved.dataloader_state == {"pos": 8}
    data = dict(saved.extra["data"])
    assert data.pop("executor") == {"epoch": 1, "replay": [["in flight"]]}
    assert again.cycle.state_dict() == data and data["replay"] == [{"id": 99}]
    assert data["epoch"] == 1 and data["replay_tags"] == [[0, 1]]
    for name in ("saver", "evaluator", "checkpointer"):
        state, restored = getattr(saved, f"{name}_state"), getattr(resumed, name).state_dict()
        assert _counters(restored) == _counters(state)
        assert restored["secs_since_fire"] >= state["secs_since_fire"]
    assert 40.0 <= saved.extra["train_seconds"] <= resumed.clock.elapsed()
    resumed.close()


def test_async_recovery_restores_the_rows_in_flight_through_the_rollout(tmp_path):
    config = grpo_config(tmp_path, *SCHEDULE, "async_training=true")
    first = fake_engines(config, [], steps=3)
    run = recover_or_start(config, first)
    _steps(run, first, stop_after=1)
    run.close()
    calls: list[tuple] = []
    recover_or_start(config, dataclasses.replace(first, rollout=type(first.rollout)(calls))).close()
    assert ("rollout", "load_data_state", {"epoch": 1, "replay": [["in flight"]]}) in calls
