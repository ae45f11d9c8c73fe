"""``WorkflowExecutor``: many ``arun_episode`` calls at once on a background event loop,
admitted by the staleness gate, with bounded queues and counters.

Threads: the trainer thread calls ``submit``/``wait``/``prepare_batch``; one daemon thread runs
an asyncio loop (uvloop when installed) that launches episodes. The loop thread and the version
clock belong to the engine, which lends them here (and runs its own coroutines, weight updates
and health probes, on the same loop without going through the executor); an executor built
without them (tests) makes its own. The loop side, launching episodes and filing their
outcomes, is ``episode_runner.py``; the dataloader side (``prepare_batch``'s rows) is
``data_cycle.py``; both are mixed into ``WorkflowExecutor``, which owns the queues and the lock.

Backpressure (both bounds are ``config.queue_size``, by default (η+2)·B + M per rank, at
least 16):
- input: ``submit`` blocks while the input queue is full, up to its ``timeout``, then raises
  ``RolloutQueueFull``; ``prepare_batch`` only pulls from the dataloader when a whole batch fits.
- output: no episode starts while finished-but-unconsumed trajectories plus running episodes
  fill the output bound; the gate is then closed until the trainer consumes.

What ``wait`` returns: the trajectories the workflow returned, concatenated with
``concat_padded_tensors``, in completion order (the oldest starts when more are ready, and room
kept for running episodes the batch is the last chance for: ``staleness.py``); nothing is added. Trajectories that started
more than η versions before the current version are dropped at consumption (counted as
``stale`` and ``rejected``; a ``prepare_batch`` row is drawn again), so none is trained on later
than invariant 1 allows and no prompt is lost to it.

Every blocking call is time-boxed (default ``config.request_timeout``) and raises with the
counters in its message; trajectories collected by a call that times out go back to the queue.
A wait also gives up early (``RolloutFailing``, with the last error) once max(16, 4·B) episodes
in a row have failed, e.g. when no server answers. A workflow's exception is counted as
``failed`` and logged; a row ``prepare_batch`` drew is drawn again (``config.episode_retries``).
An attached ``observer`` (the trace) is told of each episode queued, started and ended.
``rollout_batch``'s failed episodes are run again too (up to ``episode_retries`` times, in the
same call, so the synchronous step keeps its rows); a row given up on is dropped and counted.

Every accepted trajectory is stamped with its episode's serial number (``episode_ids``, one per
launch over the whole run: the counter is saved with the data state) and the epoch its row was
drawn in (``data_epochs``, -1 when it came from no dataloader): the run's ledger records them.
What became of each trajectory (serials, stale drops, tokens and lengths by fate) is counted in
``accounting.py``'s ``RolloutAccounts``; rows redrawn or dropped, in ``data_cycle.py``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from arealite.api.config.rollout import InferenceEngineConfig
from arealite.api.io_struct import RolloutStat, VersionClock
from arealite.api.trajectory import TensorDict, concat_padded_tensors
from arealite.api.workflow_api import RolloutWorkflow
from arealite.observe.idle_time import IdleMeter
from arealite.observe.rollout_observer import RolloutObserver
from arealite.rollout import staleness
from arealite.rollout.accounting import RolloutAccounts
from arealite.rollout.data_cycle import DataCycle, DataloaderFeed
from arealite.rollout.episode_runner import EpisodeResult, EpisodeRunner, PendingEpisode
from arealite.rollout.loop_thread import LoopThread
from arealite.rollout.staleness import StalenessManager, take_oldest

logger = logging.getLogger("arealite.rollout.executor")


class RolloutQueueFull(RuntimeError):
    """``submit`` waited out its timeout on a full input queue."""


class RolloutTimeout(TimeoutError):
    """A wait got fewer trajectories than asked for within its timeout."""


class RolloutFailing(RuntimeError):
    """Every recent episode failed (e.g. no server answers): raised by waits instead of
    waiting out their whole timeout."""


class WorkflowExecutor(EpisodeRunner, DataloaderFeed):
    def __init__(
        self, config: InferenceEngineConfig, engine: Any, loop: LoopThread | None = None,
        clock: VersionClock | None = None,
    ):
        self.config = config
        self.engine = engine  # passed to arun_episode
        self.clock = clock or VersionClock()  # read by the gate; set through set_version
        self.gate: StalenessManager | None = None
        self._restored = False  # restore() before initialize(): counters applied there
        self.queue_size = 0
        self.default_timeout = config.request_timeout
        self._input: deque[PendingEpisode] = deque()
        self._results: deque[EpisodeResult] = deque()
        self._group_done: dict[int, int] = {}
        self._groups = itertools.count()
        self._cond = threading.Condition()
        self._paused = False
        self._held = False  # drain(): no new episode, running ones go on generating
        self._accounts = RolloutAccounts()  # serials, stale drops, tokens and lengths by fate
        self._gate_counts: dict[str, int] = {}  # restored before the gate exists
        self.episode_retries = config.episode_retries
        self._fail_streak = 0  # episodes failed in a row (reset by any episode that finishes)
        self._last_failure = ""
        self._owns_loop = loop is None  # a lent loop is started and stopped by its owner
        self._lt = loop or LoopThread("rollout-executor")
        self._lt.on_exit = self._notify_all
        self.observer: RolloutObserver | None = None  # told of each episode (set_observer)
        self._running: dict[int, PendingEpisode] = {}  # started episodes, by launch number
        self._starts: dict[int, tuple[int | None, int]] = {}  # their (group, start version)
        self._launches = itertools.count()
        self._data = DataCycle()
        self._idle = IdleMeter()  # fed where _running goes 0 -> 1 and back

    # ------------------------------------------------------------------ lifecycle

    def initialize(self, train_data_parallel_size: int = 1) -> None:
        if self._lt.alive:
            raise RuntimeError("the rollout executor is already running")
        c = self.config
        self.gate = StalenessManager.per_rank(
            c.max_concurrent_rollouts, c.consumer_batch_size, c.max_head_offpolicyness,
            train_data_parallel_size, self.clock,
        )
        g = self.gate
        if self._restored:
            g.on_version_recovered(self.clock.value)
        g.restore_counts(**self._gate_counts)
        self.queue_size = c.queue_size or max(16, (g.max_staleness + 2) * g.batch_size + g.max_concurrent)
        self._idle.restart()
        if self._owns_loop:
            self._lt.start(self.launch_ready)

    def destroy(self, cleanup: Callable[[], Coroutine] | None = None, timeout: float = 10.0) -> None:
        """Cancel running episodes, run ``cleanup`` on the loop and stop it (an executor that
        owns its loop; a lent loop's owner calls ``loop.stop(executor.shutdown(...))``)."""
        if self._owns_loop and self._lt.alive:
            self._lt.stop(self.shutdown(cleanup), timeout)

    async def shutdown(self, cleanup: Callable[[], Coroutine] | None = None) -> None:
        """On the loop: launch nothing more, cancel running episodes, then ``cleanup``."""
        self._paused = True  # launch nothing more
        await self._lt.cancel_spawned(5)
        if cleanup is not None:
            await cleanup()

    def _notify_all(self) -> None:
        with self._cond:
            self._cond.notify_all()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._lt.loop

    @property
    def running(self) -> bool:
        return self._lt.alive

    def run_coroutine(self, coro: Coroutine) -> concurrent.futures.Future:
        """Run ``coro`` on the executor's loop; returns a thread-safe future."""
        return self._lt.run(coro)

    def _check_alive(self) -> None:
        self._lt.check_alive("rollout executor")

    # ------------------------------------------------------------------ the trainer side

    def submit(
        self, data: Any, workflow: RolloutWorkflow, timeout: float | None = None,
        _group: int | None = None, _attempts: int = 0, _epoch: int = -1,
    ) -> None:
        """Queue one episode; blocks while the input queue is full (up to ``timeout``)."""
        if not isinstance(workflow, RolloutWorkflow):
            raise TypeError(f"workflow must be a RolloutWorkflow, got {type(workflow).__name__}")
        self._check_alive()
        obs = self.observer  # the episode's wait in the queue starts now
        observed = None if obs is None else obs.on_episode_submitted()
        deadline = time.monotonic() + (self.default_timeout if timeout is None else timeout)
        with self._cond:
            while len(self._input) >= self.queue_size:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RolloutQueueFull(
                        f"rollout input queue full ({self.queue_size} pending); consume results "
                        f"or raise queue_size. {self._describe()}"
                    )
                self._cond.wait(min(left, 1.0))
            self._input.append(PendingEpisode(data, workflow, _group, _attempts, observed, _epoch))
            self.gate.on_submit()
        self._lt.wake()

    def wait(
        self,
        count: int,
        timeout: float | None = None,
        should_accept: Callable[[TensorDict], bool] | None = None,
    ) -> TensorDict:
        """Block until ``count`` trajectories pass ``should_accept`` (and the staleness check)."""
        out = self._collect(count, timeout, should_accept, group=None, raise_on_timeout=True)
        return concat_padded_tensors([r.traj for r in out])

    def rollout_batch(
        self,
        data: list[Any],
        workflow: RolloutWorkflow,
        should_accept: Callable[[TensorDict], bool] | None = None,
        timeout: float | None = None,
    ) -> TensorDict:
        """Synchronous: run one episode per item and return the accepted trajectories once
        every episode has finished (rejected or failed ones are counted, not waited for)."""
        if not data:
            raise ValueError("rollout_batch needs at least one item")
        deadline = time.monotonic() + (self.default_timeout if timeout is None else timeout)
        group = next(self._groups)
        with self._cond:
            self._group_done[group] = 0
        try:
            for item in data:
                self.submit(item, workflow, timeout=max(0.0, deadline - time.monotonic()), _group=group)
            with self._cond:
                while self._group_done[group] < len(data):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise RolloutTimeout(
                            f"rollout_batch: {self._group_done[group]}/{len(data)} episodes "
                            f"finished before the timeout. {self._describe()}"
                        )
                    self._check_alive()
                    self._cond.wait(min(left, 1.0))
            out = self._collect(None, 0, should_accept, group=group, raise_on_timeout=False)
        finally:
            with self._cond:
                self._group_done.pop(group, None)
        if not out:
            if should_accept is not None:  # every episode turned down: the caller draws again
                return {}
            raise RuntimeError(f"rollout_batch: no episode was accepted. {self._describe()}")
        return concat_padded_tensors([r.traj for r in out])

    def prepare_batch(
        self,
        dataloader: Any,
        workflow: RolloutWorkflow,
        should_accept: Callable[[TensorDict], bool] | None = None,
        timeout: float | None = None,
    ) -> TensorDict:
        """Asynchronous: keep the input queue topped up from ``dataloader`` (what the gate admits
        now plus one batch behind it, so episodes start the moment the version moves) and
        return the next B accepted trajectories."""
        self._check_alive()
        b = self.gate.batch_size
        deadline = time.monotonic() + (self.default_timeout if timeout is None else timeout)
        while True:
            self._top_up(dataloader, workflow)
            left = deadline - time.monotonic()
            out = self._collect(b, min(0.5, max(left, 0.0)), should_accept, None, raise_on_timeout=False)
            if out is not None:
                return concat_padded_tensors([r.traj for r in out])
            if time.monotonic() >= deadline:
                raise RolloutTimeout(f"prepare_batch: no batch of {b} within the timeout. {self._describe()}")

    def _collect(
        self,
        count: int | None,
        timeout: float | None,
        should_accept: Callable[[TensorDict], bool] | None,
        group: int | None,
        raise_on_timeout: bool,
    ) -> list[EpisodeResult] | None:
        """Take ``count`` results of ``group`` (all of them when ``count`` is None) that pass the
        checks. On timeout, puts back what it took and raises or returns None."""
        deadline = time.monotonic() + (self.default_timeout if timeout is None else timeout)
        hold_until = time.monotonic() + staleness.LAST_CHANCE_WAIT
        kept: list[EpisodeResult] = []
        while count is None or len(kept) < count:
            with self._cond:
                n = None if count is None else count - len(kept)
                if n is not None and time.monotonic() < hold_until:  # room for the running
                    # episodes this batch is the last chance for (staleness.LAST_CHANCE_WAIT)
                    n -= min(n, self.gate.last_chance([v for grp, v in self._starts.values()
                                                       if grp == group]))
                taken: list[EpisodeResult] = []
                if n != 0:
                    taken, self._results = take_oldest(self._results, group, n)
                if not taken:
                    left = deadline - time.monotonic()
                    if count is None or left <= 0:
                        if count is None:
                            break
                        self._results.extendleft(reversed(kept))
                        if not raise_on_timeout:
                            return None
                        raise RolloutTimeout(
                            f"wait: {len(kept)}/{count} trajectories after {timeout} s. "
                            f"{self._describe()}"
                        )
                    self._check_alive()
                    self._check_failing(kept)
                    self._cond.wait(min(left, 1.0))
                    continue
            dropped = 0
            for r in taken:  # user code runs outside the lock
                if self.gate.is_stale(r.start_version):
                    self._accounts.dropped_stale(r.traj)
                    dropped += 1
                    # counted in rollout/stale each step; one line per drop drowned the console
                    logger.debug("dropped a trajectory started at version %d (stale)", r.start_version)
                    if r.group is None:  # its prompt is drawn again: stale costs time, not data
                        with self._cond:
                            self._data.redraw(r.data, r.attempts, self.episode_retries, r.epoch,
                                              "stale")
                elif should_accept is not None and not should_accept(r.traj):
                    dropped += 1
                else:
                    kept.append(r)
            for _ in range(dropped):
                self.gate.on_drop_accepted()
            self._lt.wake()  # room in the output bound (and in the budget, if dropped)
        # counted once the batch is final: a call that times out puts what it took back, and
        # counting at each take counted those again at the next call (prepare_batch retries
        # every 0.5 s), inflating rollout/trained_tokens and so deflating
        # rollout/untrained_token_share (found by the length-bias counters)
        for r in kept:
            self._accounts.trained(r.traj)
        return kept

    def take_generated(self) -> tuple[list[int], list[float]]:
        """Generated lengths and rewards of the trajectories finished since the previous call
        (trained, dropped as stale or turned down alike): the length-bias stats' other side."""
        with self._cond:
            return self._accounts.take_generated()

    def _check_failing(self, kept: list[EpisodeResult]) -> None:
        """Raise when the last max(16, 4·B) episodes all failed (call under ``_cond``)."""
        limit = max(16, 4 * self.gate.batch_size)
        if self._fail_streak >= limit:
            self._fail_streak = 0  # the next wait gets a fresh chance
            self._results.extendleft(reversed(kept))
            raise RolloutFailing(
                f"the last {limit} episodes failed; last error: {self._last_failure}. "
                f"{self._describe()}"
            )

    # ------------------------------------------------------------------ control and counters

    def pause(self) -> None:
        """Stop launching new episodes; running ones continue."""
        self._paused = True

    def resume(self) -> None:
        self._paused = False
        self._lt.wake()

    def drain(self, timeout: float | None = None) -> None:
        """Start no new episode and wait until none runs: unlike ``pause``, running episodes keep
        generating and finish (their trajectories stay queued), so the servers end up idle, e.g.
        for an evaluation. ``undrain`` ends it, also after a drain's ``RolloutTimeout``."""
        self._held = True
        deadline = time.monotonic() + (self.default_timeout if timeout is None else timeout)
        with self._cond:
            while self._running:
                if time.monotonic() >= deadline:
                    raise RolloutTimeout(f"drain: episodes still running after {timeout} s. {self._describe()}")
                self._check_alive()
                self._cond.wait(min(max(deadline - time.monotonic(), 0.01), 1.0))

    def undrain(self) -> None:
        self._held = False
        self._lt.wake()

    @property
    def paused(self) -> bool:
        return self._paused

    def set_version(self, version: int) -> None:
        if self.gate is not None:
            self.gate.set_version(version)  # under the gate's lock, with its counters
        else:
            self.clock.value = int(version)
        self._lt.wake()

    def get_version(self) -> int:
        return self.clock.value

    def restore(self, version: int) -> None:
        """Restart at ``version``: the gate's counters as if v·B trajectories were consumed (see
        ``StalenessManager.on_version_recovered``). Before or after ``initialize``, alike."""
        if self.gate is not None:
            self.gate.on_version_recovered(version)
        else:
            self.clock.value = int(version)
            self._restored = True
        self._lt.wake()

    def stat(self) -> RolloutStat:
        return self.gate.stat()

    def counters(self) -> dict[str, int]:
        s = self.gate.stat()
        with self._cond:
            pending, ready = len(self._input), len(self._results)
        return {
            "submitted": s.submitted, "running": s.running, "accepted": s.accepted,
            "rejected": s.rejected, "failed": s.failed, "stale": self._accounts.stale,
            "redrawn": self._data.redrawn, "dropped": self._data.dropped,
            **{f"dropped_{k}": n for k, n in sorted(self._data.dropped_by.items())},
            "episodes": self._accounts.episodes,
            "pending": pending, "ready": ready, "capacity": self.gate.capacity(),
            "version": self.gate.version, **self._accounts.tokens, **self._accounts.seqs,
        }

    def counter_state(self) -> dict[str, int]:
        """The counters a resumed run goes on from (saved with the data state): the episode
        serial, stale drops and tokens by fate, and the gate's failed / rejected counts."""
        s = self.gate.stat() if self.gate is not None else None
        gate = {"failed": s.failed, "rejected": s.rejected} if s else dict(self._gate_counts)
        return {**self._accounts.state(), **gate}

    def load_counter_state(self, state: dict[str, int]) -> None:
        self._accounts.load_state(state)
        self._gate_counts = {k: int(state[k]) for k in ("failed", "rejected") if k in state}
        if self.gate is not None:
            self.gate.restore_counts(**self._gate_counts)

    def take_dropped(self) -> list[dict[str, Any]]:
        """Rows given up on since the previous call, with their reasons (for the ledger)."""
        with self._cond:
            return self._data.take_dropped()

    def idle_stats(self) -> dict[str, float]:
        """``rollout/idle_s``: wall time with no episode in flight (so the servers generate
        nothing for training) since the previous call (the first: since ``initialize``), and
        ``rollout/idle_ratio``, its share of that window."""
        with self._cond:
            return self._idle.take(bool(self._running))

    def _describe(self) -> str:
        c = self.counters() if self.gate is not None else {}
        return "counters: " + ", ".join(f"{k}={v}" for k, v in c.items())
