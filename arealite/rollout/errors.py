"""What the executor's blocking calls raise (importable without the executor)."""

from __future__ import annotations


class RolloutQueueFull(RuntimeError):
    """``submit`` waited out its timeout on a full input queue."""


class RolloutTimeout(TimeoutError):
    """A wait got fewer trajectories than asked for within its timeout."""


class RolloutFailing(RuntimeError):
    """Every recent episode failed (e.g. no server answers): raised by waits instead of
    waiting out their whole timeout."""
