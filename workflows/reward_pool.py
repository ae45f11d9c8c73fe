"""Reward functions run off the event loop: a shared pool of worker processes, each call under a
timeout.

A reward function has the signature ``reward_fn(prompt, completion, prompt_ids, completion_ids,
**row) -> float`` and must be importable (a module-level function, a ``functools.partial`` of
one, or an instance of a module-level class) because workers are started with ``spawn`` (the
trainer runs torch threads, and ``fork`` after threads is unsafe).

- A call that runs past its timeout kills its worker (a replacement is started) and fails.
- A call that raises, returns a non-number or NaN, or whose worker dies fails.
- A failed call raises ``RewardFailed`` from ``compute_reward``: the episode is rejected, not
  trained, and the executor draws its prompt again. ``reward_failure="zero"`` (a workflow
  argument) keeps the old behaviour of scoring it 0.
- Every such outcome is counted in ``arealite.api.reward_api`` (``reward_stats()``), where the
  trainer's stats read them; the contract (``check_reward_fn``, ``RewardFailed``) is there too.
- Per-function opt-out: a reward decorated with ``@inline_reward`` (``arealite.api.reward_api``)
  runs directly on the calling thread (no process hop, no timeout). Use it only for cheap,
  pure-Python functions that cannot hang (``workflows.rewards.toy.toy_reward`` is one);
  exceptions are still caught and counted.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import multiprocessing as mp
import os
import pickle
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from arealite.api.reward_api import (
    REWARD_FAILURE_POLICIES,
    RewardFailed,
    as_reward,
    count_reward,
    is_inline,
    observe_reward_call,
)

logger = logging.getLogger("workflows.reward_pool")

# How long a fresh worker may take to import the reward's module (sympy, for example) before
# its first call; this is not charged to the call's own timeout.
LOAD_TIMEOUT = 120.0


# --------------------------------------------------------------------------- worker side


def _worker_main(conn) -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    fns: dict[bytes, Callable] = {}
    while True:
        try:
            msg = conn.recv_bytes()
        except (EOFError, OSError):
            return  # the parent is gone
        try:
            op, key, body = pickle.loads(msg)
            if op == "load":
                if key not in fns:
                    fns[key] = pickle.loads(body)
                reply = ("ok", None)
            else:
                args, kwargs = body
                reply = ("ok", as_reward(fns[key](*args, **kwargs)))
        except BaseException as e:  # noqa: BLE001 - report everything, keep serving
            reply = ("err", f"{type(e).__name__}: {e}")
        try:
            conn.send(reply)
        except (OSError, ValueError):
            return


class _Worker:
    def __init__(self, ctx):
        parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child,), daemon=True,
                                name="arealite-reward-worker")
        self.proc.start()
        child.close()
        self.conn = parent
        self.loaded: set[bytes] = set()
        count_reward("workers_started")

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.join(timeout=5)
        except Exception:  # noqa: BLE001 - best effort on a broken worker
            pass
        self.conn.close()

    def request(self, msg: tuple, timeout: float) -> tuple[str, Any]:
        """('ok'|'err', value) or ('timeout'|'crash', reason)."""
        try:
            self.conn.send_bytes(pickle.dumps(msg))
            if not self.conn.poll(timeout):
                return "timeout", f"no answer within {timeout:.1f}s"
            return self.conn.recv()
        except (EOFError, OSError, BrokenPipeError) as e:
            return "crash", f"worker died ({type(e).__name__}; exit code {self.proc.exitcode})"


# --------------------------------------------------------------------------- the pool


class RewardPool:
    """``n_workers`` processes; a call waits for a free one, then runs under its timeout."""

    def __init__(self, n_workers: int = 2, start_method: str = "spawn"):
        if n_workers < 1:
            raise ValueError("n_workers must be >= 1")
        if start_method == "fork":
            raise ValueError("the 'fork' start method is unsafe with torch threads; use spawn or forkserver")
        self.n_workers = n_workers
        self._ctx = mp.get_context(start_method)
        self._slots = threading.BoundedSemaphore(n_workers)
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self._threads = ThreadPoolExecutor(max_workers=4 * n_workers, thread_name_prefix="reward")
        self._pid = os.getpid()
        self._closed = False

    def _take(self) -> _Worker:
        with self._lock:
            while self._idle:
                w = self._idle.pop()
                if w.proc.is_alive():
                    return w
                count_reward("worker_crashes")
                w.kill()
        return _Worker(self._ctx)

    def _give_back(self, w: _Worker) -> None:
        with self._lock:
            if self._closed:
                w.kill()
            else:
                self._idle.append(w)

    def call(self, fn: Callable, args: tuple, kwargs: dict, timeout: float) -> float | None:
        """Blocking: the reward, or None on timeout / error / crash (each counted and logged)."""
        if self._closed:
            raise RuntimeError("the reward pool is shut down")
        count_reward("calls")
        try:
            body = pickle.dumps(fn)
        except Exception as e:  # noqa: BLE001
            count_reward("errors")
            logger.warning("reward %r is not picklable: %s", fn, e)
            return None
        key = body  # the pickled reference identifies the function in a worker's cache
        with self._slots:
            w = self._take()
            if key not in w.loaded:
                status, val = w.request(("load", key, body), LOAD_TIMEOUT)
                if status == "ok":
                    w.loaded.add(key)
                else:
                    return self._failed(w, status, val, fn)
            t0 = time.monotonic()
            status, val = w.request(("call", key, (args, kwargs)), timeout)
            if status != "ok":
                return self._failed(w, status, val, fn, time.monotonic() - t0)
            self._give_back(w)
            count_reward("ok")
            return val

    def _failed(self, w: _Worker, status: str, why: str, fn: Callable, dt: float = 0.0) -> None:
        name = getattr(fn, "__name__", type(fn).__name__)
        if status == "err":
            self._give_back(w)  # the worker itself is fine
            count_reward("errors")
            logger.warning("reward %s raised %s", name, why)
        else:
            w.kill()  # a hung worker is killed; a new one starts on demand
            count_reward("timeouts" if status == "timeout" else "worker_crashes")
            logger.warning("reward %s %s after %.1fs (%s)", name, status, dt, why)
        return None

    async def acall(self, fn: Callable, *args: Any, timeout: float, **kwargs: Any) -> float | None:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._threads, self.call, fn, args, kwargs, timeout)

    def shutdown(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for w in idle:
            w.kill()
        self._threads.shutdown(wait=False, cancel_futures=True)


_pool: RewardPool | None = None
_pool_lock = threading.Lock()


def default_workers() -> int:
    return int(os.environ.get("AREALITE_REWARD_WORKERS", min(4, os.cpu_count() or 1)))


def get_reward_pool() -> RewardPool:
    """The process-wide pool, created on first use (rebuilt in a forked child)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool._pid != os.getpid() or _pool._closed:
            start = os.environ.get("AREALITE_REWARD_START_METHOD", "spawn")
            _pool = RewardPool(default_workers(), start)
        return _pool


def shutdown_reward_pool() -> None:
    global _pool
    with _pool_lock:
        pool, _pool = _pool, None
    if pool is not None and pool._pid == os.getpid():
        pool.shutdown()


atexit.register(shutdown_reward_pool)


async def compute_reward(
    fn: Callable, prompt: str, completion: str, prompt_ids: list[int],
    completion_ids: list[int], row: dict[str, Any], timeout: float, on_failure: str = "reject",
) -> float:
    """One reward: inline or through the shared pool. When the function raises, times out or
    loses its worker (counted and logged either way): ``on_failure="reject"`` raises
    ``RewardFailed``, so the episode is not trained and its prompt is drawn again;
    ``"zero"`` scores it 0."""
    if on_failure not in REWARD_FAILURE_POLICIES:
        raise ValueError(f"reward_failure must be one of {REWARD_FAILURE_POLICIES}, got {on_failure!r}")
    kwargs = {k: v for k, v in row.items() if k not in _RESERVED}
    args = (prompt, completion, list(prompt_ids), list(completion_ids))
    name = getattr(fn, "__name__", type(fn).__name__)
    t0 = time.perf_counter()
    if is_inline(fn):
        count_reward("calls")
        count_reward("inline")
        try:
            r: float | None = as_reward(fn(*args, **kwargs))
            count_reward("ok")
        except Exception as e:  # noqa: BLE001 - counted; the policy decides what it costs
            count_reward("errors")
            logger.warning("inline reward %s raised %s: %s", name, type(e).__name__, e)
            r = None
    else:
        r = await get_reward_pool().acall(fn, *args, timeout=timeout, **kwargs)
    observe_reward_call(name, t0, time.perf_counter(), r is not None)  # the trace, when on
    if r is not None:
        return r
    if on_failure == "zero":
        return 0.0
    raise RewardFailed(f"reward {name} failed (see the warning above); the episode is rejected "
                       "and its prompt drawn again (reward_failure='zero' scores it 0 instead)")


# Row keys that would collide with the positional arguments are not passed on.
_RESERVED = frozenset({"prompt", "completion", "prompt_ids", "completion_ids"})
