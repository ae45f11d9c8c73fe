"""RolloutIdleMeter: wall time with no episode in flight (the benchmark's rollout idle ratio)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from arealite.trainer.rollout_stats import RolloutIdleMeter


class FakeExecutor:
    def __init__(self) -> None:
        self.running = 0

    def stat(self):
        return SimpleNamespace(running=self.running)


def test_idle_time_and_ratio():
    ex = FakeExecutor()
    meter = RolloutIdleMeter(SimpleNamespace(executor=ex), interval=0.005)
    try:
        ex.running = 3
        time.sleep(0.3)
        ex.running = 0
        time.sleep(0.3)
        ex.running = 1
        time.sleep(0.05)
        first = meter.take()
        assert first["rollout/idle_s"] == pytest.approx(0.3, abs=0.08)
        assert first["rollout/idle_ratio"] == pytest.approx(0.3 / 0.65, abs=0.12)
        time.sleep(0.2)  # busy the whole time: nothing idle since the last take
        second = meter.take()
        assert second["rollout/idle_s"] < 0.03 and second["rollout/idle_ratio"] < 0.15
    finally:
        meter.close()


def test_no_executor_means_no_figures():
    meter = RolloutIdleMeter(object())
    assert meter.take() == {}
    meter.close()
