"""The evaluation hook (#28): the user's eval_fn by import path, run with the training rollout
drained, its time apart (``timeperf/eval``) and excluded from the training clock."""

from __future__ import annotations

import sys

import pytest

from arealite.api.config.run import EvaluatorConfig
from arealite.trainer.eval_hook import TrainClock, load_eval_fn, run_evaluation


class FakeExecutor:
    def __init__(self, log):
        self.log = log

    def drain(self, timeout=None):
        self.log.append("drain")

    def undrain(self):
        self.log.append("undrain")


class FakeRollout:
    def __init__(self, log):
        self.executor = FakeExecutor(log)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_eval.py").write_text(
        "LOG = []\n"
        "def evaluate(engine, rows, *, tokenizer, version):\n"
        "    LOG.append(('eval', engine, len(rows), tokenizer, version))\n"
        "    return {'accuracy': 0.5, 'custom/x': 2}\n"
        "def bad(engine):\n"
        "    return {}\n"
        "def needs_more(engine, rows, *, grader):\n"
        "    return {}\n"
        "def not_a_dict(engine, rows):\n"
        "    return 1.0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("my_eval", None)


def test_eval_fn_runs_between_drain_and_undrain_with_its_context(user_module):
    fn = load_eval_fn("my_eval:evaluate")
    log = sys.modules["my_eval"].LOG
    log.clear()
    rows = [{"id": i} for i in range(10)]
    out = run_evaluation(FakeRollout(log), "ENGINE", "WF", rows, EvaluatorConfig(max_prompts=4), fn,
                         {"tokenizer": "TOK", "version": 3, "config": "CFG"})
    assert log == ["drain", ("eval", "ENGINE", 4, "TOK", 3), "undrain"]
    assert out["eval/accuracy"] == 0.5 and out["custom/x"] == 2.0
    assert out["timeperf/eval"] >= 0.0


def test_undrain_even_when_the_eval_fails(user_module):
    log: list = []
    fn = load_eval_fn("my_eval:not_a_dict")
    with pytest.raises(TypeError, match="not a dict"):
        run_evaluation(FakeRollout(log), None, None, [{}], EvaluatorConfig(), fn)
    assert log == ["drain", "undrain"]


def test_bad_eval_fn_paths_and_signatures_say_what_is_wrong(user_module):
    assert load_eval_fn(None) is None
    with pytest.raises(TypeError, match=r"must accept \(engine, rows\)"):
        load_eval_fn("my_eval:bad")
    with pytest.raises(TypeError, match="grader"):
        load_eval_fn("my_eval:needs_more")
    with pytest.raises(ImportError, match="no_such_module"):
        load_eval_fn("no_such_module:f")


def test_train_clock_excludes_paused_time_and_carries_a_restart():
    now = [100.0]
    clock = TrainClock(clock=lambda: now[0])
    now[0] += 5
    with clock.paused():
        now[0] += 30  # an evaluation
    now[0] += 2
    assert clock.elapsed() == pytest.approx(7.0)
    resumed = TrainClock(already=7.0, clock=lambda: now[0])
    now[0] += 1
    assert resumed.elapsed() == pytest.approx(8.0)
