import pytest

from arealite.api.config.run import SaverConfig
from arealite.observe.stats_tracker import StatsTracker
from arealite.observe.timing import FreqController, timer


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _fired(ctl: FreqController, n_steps: int, steps_per_epoch: int = 1000) -> list[int]:
    out = []
    for step in range(1, n_steps + 1):
        if ctl.check(epochs=int(step % steps_per_epoch == 0), steps=1):
            out.append(step)
    return out


def test_step_frequency():
    assert _fired(FreqController(freq_steps=3), 10) == [3, 6, 9]


def test_epoch_frequency():
    assert _fired(FreqController(freq_epochs=2), 20, steps_per_epoch=4) == [8, 16]


def test_disabled_never_fires_and_zero_means_disabled():
    assert _fired(FreqController(), 10) == []
    assert not FreqController(freq_steps=0).enabled
    assert FreqController(freq_secs=5).enabled


def test_time_frequency_with_fake_clock():
    clock = FakeClock()
    ctl = FreqController(freq_secs=10, clock=clock)
    fired = []
    for step in range(1, 8):
        clock.t += 4.0
        if ctl.check(steps=1):
            fired.append(step)
    assert fired == [3, 6]  # at 12 s and 24 s (12 s after the firing at 12 s)


def test_criteria_are_independent():
    clock = FakeClock()
    ctl = FreqController(freq_steps=4, freq_secs=5, clock=clock)
    fired = []
    for step in range(1, 9):
        clock.t += 4.0 if step == 2 else 0.5  # 5 s are reached at step 3 only
        if ctl.check(steps=1):
            fired.append(step)
    assert fired == [3, 4, 8]  # the step schedule stays at multiples of 4


def test_state_dict_resumes_the_same_schedule():
    clock = FakeClock()
    full = FreqController(freq_steps=5, freq_secs=100, clock=clock)
    assert _fired(full, 13) == [5, 10]
    part = FreqController(freq_steps=5, freq_secs=100, clock=clock)
    _fired(part, 7)
    state = part.state_dict()
    clock.t += 1000  # the restart happens much later in wall-clock time
    resumed = FreqController(freq_steps=5, freq_secs=100, clock=clock)
    resumed.load_state_dict(state)
    assert [7 + s for s in _fired(resumed, 6)] == [10]  # steps 8..13 as in the full run
    assert resumed.state_dict()["secs_since_fire"] == pytest.approx(state["secs_since_fire"])


def test_from_config_and_bad_input():
    ctl = FreqController.from_config(SaverConfig(freq_steps=2))
    assert _fired(ctl, 4) == [2, 4]
    with pytest.raises(ValueError):
        FreqController(freq_steps=-1)
    with pytest.raises(ValueError):
        FreqController(freq_steps=1).check(steps=-1)


def test_timer_accumulates_into_tracker():
    t = StatsTracker()
    ticks = iter([0.0, 0.25, 1.0, 1.5])
    clock = lambda: next(ticks)  # noqa: E731
    with timer("rollout_wait", tracker=t, clock=clock):
        pass
    with pytest.raises(RuntimeError), timer("rollout_wait", tracker=t, clock=clock):
        raise RuntimeError("recorded anyway")
    assert t.export() == {"timeperf/rollout_wait": 0.75}
