"""Rollout idle time: wall time with no episode in flight, so the servers generate nothing for
training (the benchmark's ``rollout/idle_ratio``). Fed by the executor where its in-flight
count goes 0 -> 1 (``busy``) and 1 -> 0 (``idle``): no thread, no polling. Not thread-safe on
its own: the executor calls it under its lock."""

from __future__ import annotations

import time


class IdleMeter:
    def __init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        """Nothing in flight from now on; a new window opens."""
        self._idle_s = 0.0
        self._since = self._window_start = time.perf_counter()

    def busy(self) -> None:
        """The first episode started: the idle stretch ends."""
        self._idle_s += time.perf_counter() - self._since

    def idle(self) -> None:
        """The last episode ended: an idle stretch begins."""
        self._since = time.perf_counter()

    def take(self, in_flight: bool) -> dict[str, float]:
        """``rollout/idle_s`` and ``rollout/idle_ratio`` since the previous call."""
        now = time.perf_counter()
        idle = self._idle_s + (0.0 if in_flight else now - self._since)
        self._idle_s = 0.0
        if not in_flight:
            self._since = now
        span, self._window_start = now - self._window_start, now
        return {"rollout/idle_s": idle, "rollout/idle_ratio": min(1.0, idle / max(span, 1e-9))}
