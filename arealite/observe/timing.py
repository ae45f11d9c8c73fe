"""When to save/evaluate/checkpoint (``FreqController``) and per-phase wall-clock timers.

``FreqController`` fires every ``freq_epochs`` epochs, every ``freq_steps`` steps or every
``freq_secs`` seconds, whichever comes first; each criterion keeps its own counter, so a
step-based schedule stays at multiples of N even when the time criterion fires in between.
Its state (counters and seconds since the last firing, not wall-clock timestamps) goes into the
recovery checkpoint, so a resumed run fires at the same steps as an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from arealite.observe import stats_tracker, trace
from arealite.observe.stats_tracker import ReduceType, StatsTracker


class FreqController:
    """Fires on epoch, step or time boundaries; ``None`` (or 0) disables a criterion."""

    def __init__(
        self,
        freq_epochs: int | None = None,
        freq_steps: int | None = None,
        freq_secs: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        for name, v in (("freq_epochs", freq_epochs), ("freq_steps", freq_steps),
                        ("freq_secs", freq_secs)):
            if v is not None and v < 0:
                raise ValueError(f"{name} must be >= 0 or None, got {v}")
        self.freq_epochs = freq_epochs or None
        self.freq_steps = freq_steps or None
        self.freq_secs = freq_secs or None
        self._clock = clock
        self._epochs = 0
        self._steps = 0
        self._last_fire = clock()

    @classmethod
    def from_config(cls, config: Any, clock: Callable[[], float] = time.monotonic) -> FreqController:
        """From any config with ``freq_epochs``/``freq_steps``/``freq_secs`` (SaverConfig & co)."""
        return cls(config.freq_epochs, config.freq_steps, config.freq_secs, clock=clock)

    @property
    def enabled(self) -> bool:
        return any(x is not None for x in (self.freq_epochs, self.freq_steps, self.freq_secs))

    def check(self, epochs: int = 0, steps: int = 0) -> bool:
        """Count ``epochs`` finished epochs and ``steps`` finished steps; True when any criterion
        is reached (its counter then restarts). Call once per step, after the step."""
        if epochs < 0 or steps < 0:
            raise ValueError("epochs and steps must be >= 0")
        fire = False
        if self.freq_epochs is not None:
            self._epochs += epochs
            if self._epochs >= self.freq_epochs:
                self._epochs = 0
                fire = True
        if self.freq_steps is not None:
            self._steps += steps
            if self._steps >= self.freq_steps:
                self._steps = 0
                fire = True
        now = self._clock()
        if self.freq_secs is not None and now - self._last_fire >= self.freq_secs:
            self._last_fire = now
            fire = True
        return fire

    def state_dict(self) -> dict[str, Any]:
        return {
            "freq_epochs": self.freq_epochs, "freq_steps": self.freq_steps,
            "freq_secs": self.freq_secs, "epochs": self._epochs, "steps": self._steps,
            "secs_since_fire": self._clock() - self._last_fire,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore counters (the frequencies themselves come from the current config)."""
        self._epochs = int(state["epochs"])
        self._steps = int(state["steps"])
        self._last_fire = self._clock() - float(state["secs_since_fire"])


@contextlib.contextmanager
def timer(
    name: str,
    tracker: StatsTracker | None = None,
    prefix: str = "timeperf",
    clock: Callable[[], float] = time.perf_counter,
) -> Iterator[None]:
    """Time the block and add its seconds to ``{prefix}/{name}`` in the stats tracker.

    Repeated blocks of the same name within one step add up on a rank; ranks are averaged at
    export (``ReduceType.SUM_PER_RANK``). The time is recorded even if the block raises."""
    t = tracker if tracker is not None else stats_tracker.DEFAULT_TRACKER
    t0 = clock()
    try:
        yield
    finally:
        t1 = clock()
        dt = t1 - t0
        with t.scope(prefix):
            t.scalar(reduce_type=ReduceType.SUM_PER_RANK, **{name: dt})
        if trace.TRACER is not None and clock is time.perf_counter:  # a phase on the timeline
            trace.TRACER.complete(name, prefix, trace.TRAINER_TID, t0, t1)
