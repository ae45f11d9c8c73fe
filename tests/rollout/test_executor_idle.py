"""The executor's idle time: wall time with no episode in flight (the benchmark's rollout idle
ratio), counted where in-flight work goes 0 -> 1 and back."""

from __future__ import annotations

import time

import pytest

from arealite.api.config.rollout import InferenceEngineConfig
from arealite.rollout.executor import WorkflowExecutor
from tests.rollout.test_executor import EchoWorkflow


def test_idle_time_and_ratio():
    cfg = InferenceEngineConfig(consumer_batch_size=1, max_head_offpolicyness=100,
                                max_concurrent_rollouts=4, request_timeout=10.0)
    ex = WorkflowExecutor(cfg, engine=None)
    ex.initialize()
    try:
        ex.idle_stats()  # open the window
        ex.submit({"id": 0}, EchoWorkflow(delay=0.3))  # busy 0.3 s
        ex.wait(1)
        time.sleep(0.3)  # idle 0.3 s
        ex.submit({"id": 1}, EchoWorkflow(delay=0.3))
        time.sleep(0.05)  # busy again
        first = ex.idle_stats()
        assert first["rollout/idle_s"] == pytest.approx(0.3, abs=0.08)
        assert first["rollout/idle_ratio"] == pytest.approx(0.3 / 0.65, abs=0.12)
        time.sleep(0.2)  # busy the whole time: nothing idle since the last call
        second = ex.idle_stats()
        assert second["rollout/idle_s"] < 0.03 and second["rollout/idle_ratio"] < 0.15
        ex.wait(1)
    finally:
        ex.destroy()


def test_idle_before_any_episode_is_the_whole_window():
    ex = WorkflowExecutor(InferenceEngineConfig(consumer_batch_size=1), engine=None)
    ex.initialize()
    try:
        ex.idle_stats()
        time.sleep(0.1)
        got = ex.idle_stats()
        assert got["rollout/idle_s"] == pytest.approx(0.1, abs=0.05) and got["rollout/idle_ratio"] > 0.9
    finally:
        ex.destroy()
