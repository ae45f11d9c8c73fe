"""The reward-function contract and its outcome counters.

A reward function has the signature ``reward_fn(prompt, completion, prompt_ids, completion_ids,
**row) -> float`` and must be importable (a module-level function, a ``functools.partial`` of
one, or an instance of a module-level class): the reward pool of ``workflows.reward_pool`` runs
it in worker processes started with ``spawn``. ``@inline_reward`` marks a cheap one to run on
the caller's thread instead.

The counters live here, not in the pool, so the trainer reads them (``reward_stats()``) without
importing the workflows that increment them: the arrow points down, into the API.
"""

from __future__ import annotations

import functools
import math
import numbers
import pickle
import threading
from collections.abc import Callable
from typing import Any


class RewardFailed(RuntimeError):
    """A reward call raised, timed out or lost its worker. By default the episode is rejected
    (not trained: a broken grader must not teach the policy that the answer was wrong) and its
    prompt is drawn again; workflows that take ``reward_failure="zero"`` score it 0 instead."""


REWARD_FAILURE_POLICIES = ("reject", "zero")

REWARD_COUNTERS = ("calls", "ok", "inline", "timeouts", "errors", "worker_crashes", "workers_started")
_stats = dict.fromkeys(REWARD_COUNTERS, 0)
_stats_lock = threading.Lock()


def count_reward(name: str, n: int = 1) -> None:
    """Add ``n`` to one of ``REWARD_COUNTERS`` (thread-safe)."""
    with _stats_lock:
        _stats[name] += n


def reward_stats() -> dict[str, int]:
    """Counters since start (or the last reset): calls, ok, inline, timeouts, errors,
    worker_crashes, workers_started. ``timeouts + errors + worker_crashes`` calls failed (their
    episodes rejected, or scored 0 under ``reward_failure="zero"``)."""
    with _stats_lock:
        return dict(_stats)


# (name, start, end, ok) of each reward call, for the trace (``arealite.observe.rollout_trace``)
_call_observer: Callable[[str, float, float, bool], None] | None = None


def set_reward_call_observer(fn: Callable[[str, float, float, bool], None] | None) -> None:
    global _call_observer
    _call_observer = fn


def observe_reward_call(name: str, start: float, end: float, ok: bool) -> None:
    """Report one finished reward call (``time.perf_counter`` times) to the observer, if any."""
    if _call_observer is not None:
        _call_observer(name, start, end, ok)


def reset_reward_stats() -> None:
    with _stats_lock:
        for k in _stats:
            _stats[k] = 0


def inline_reward(fn: Callable) -> Callable:
    """Mark ``fn`` to run on the caller's thread instead of the process pool."""
    fn.arealite_inline = True
    return fn


def is_inline(fn: Callable) -> bool:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return bool(getattr(fn, "arealite_inline", False))


def as_reward(value: Any) -> float:
    """A reward function's return value as a float; ``TypeError``/``ValueError`` (one line) for
    anything but a real number: a string "1.0" or a tensor is a bug in the reward, not a score
    to guess at, so its episode is rejected with this message."""
    if isinstance(value, numbers.Real):  # int, float, bool, numpy's real scalars
        r = float(value)
    else:
        raise TypeError(f"the reward returned {type(value).__name__} {value!r:.40}, not a number "
                        "(return a float)")
    if math.isnan(r):
        raise ValueError("the reward returned NaN")
    return r


def check_reward_fn(fn: Any) -> None:
    """Raise a clear ``TypeError`` for a reward the pool cannot run."""
    if not callable(fn):
        raise TypeError(f"reward_fn must be callable, got {type(fn).__name__}")
    if not is_inline(fn):
        try:
            pickle.dumps(fn)
        except Exception as e:  # noqa: BLE001 - any pickling failure means the same thing
            raise TypeError(
                f"reward_fn {fn!r} cannot be sent to reward worker processes ({e}); define it at "
                "module level (lambdas and closures are not importable), or mark a cheap one "
                "with @arealite.api.reward_api.inline_reward"
            ) from None
