"""The staleness gate (ARCHITECTURE invariant 1) and the rollout counters it reads.

With η = ``max_head_offpolicyness``, B = consumer batch size *per data-parallel rank*, v = the
current weight version and M = ``max_concurrent_rollouts`` per rank, a new episode may start
only while ::

    capacity = min(M - running, (η + v + 1)·B - (accepted + running)) > 0

``accepted`` counts every trajectory accepted since version 0 (consumed or not); a rejected or
failed episode never counts, so it frees its slot. The trainer consumes B trajectories per
version, so an episode admitted at version v is (in order of admission) among the first
(η + v + 1)·B and is trained on by version v + η. Completion order can differ from admission
order, so the executor also drops, at consumption, any trajectory that started more than η
versions ago (``is_stale``) - the gate keeps that rare, the check makes it a guarantee.

Nothing generated is thrown away for arriving late: a batch keeps room for the running episodes
for which it is the last chance (``last_chance``) and waits for them, up to ``LAST_CHANCE_WAIT``
seconds per batch (a hung episode cannot stall training), while younger ready ones wait a step;
and ready trajectories are consumed oldest start first (``take_oldest``). The share of generated
tokens dropped anyway is reported as ``rollout/untrained_token_share``.

Restart safety: a recovered run at version v has consumed v·B trajectories, so
``on_version_recovered(v)`` restores ``accepted = v·B`` with nothing running. Without it, a
fresh counter would admit (η + v + 1)·B episodes at once, all started at v.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import asdict
from typing import Any

from arealite.api.io_struct import RolloutStat, VersionClock

# Seconds a batch waits at most for running episodes it is the last chance for (see above).
LAST_CHANCE_WAIT = 30.0


class StalenessManager:
    """Thread-safe counters plus the capacity formula; the executor calls ``on_*`` hooks."""

    def __init__(
        self, max_concurrent: int, consumer_batch_size: int, max_staleness: int,
        clock: VersionClock | None = None,
    ):
        if max_concurrent < 1 or consumer_batch_size < 1 or max_staleness < 0:
            raise ValueError(
                f"bad staleness settings: max_concurrent={max_concurrent}, "
                f"consumer_batch_size={consumer_batch_size}, max_staleness={max_staleness}"
            )
        self.max_concurrent = max_concurrent
        self.batch_size = consumer_batch_size
        self.max_staleness = max_staleness
        self._clock = clock or VersionClock()  # the engine's, when it lends one
        self._stat = RolloutStat()
        self._lock = threading.Lock()

    @classmethod
    def per_rank(
        cls, max_concurrent: int | None, consumer_batch_size: int, max_staleness: int, dp_size: int,
        clock: VersionClock | None = None,
    ) -> StalenessManager:
        """Split global settings over ``dp_size`` data-parallel ranks (each rank runs its own)."""
        if dp_size < 1:
            raise ValueError(f"data-parallel size must be >= 1, got {dp_size}")
        b = max(1, consumer_batch_size // dp_size)
        m = max(1, (max_concurrent or consumer_batch_size) // dp_size)
        return cls(m, b, max_staleness, clock)

    # ------------------------------------------------------------------ queries

    @property
    def version(self) -> int:
        return self._clock.value

    def capacity(self) -> int:
        """How many new episodes may start now (may be negative after a version rollback)."""
        with self._lock:
            return self._capacity_locked()

    def _capacity_locked(self) -> int:
        s = self._stat
        concurrency = self.max_concurrent - s.running
        staleness = (self.max_staleness + self._clock.value + 1) * self.batch_size - (
            s.accepted + s.running
        )
        return min(concurrency, staleness)

    def stat(self) -> RolloutStat:
        with self._lock:
            return RolloutStat(**asdict(self._stat))

    def last_chance(self, start_versions: list[int]) -> int:
        """How many of these (running) episodes the next version makes stale: a batch taken now
        is the last one that may train them."""
        v = self._clock.value
        return sum(1 for s in start_versions if v - s >= self.max_staleness)

    def is_stale(self, start_version: int, version: int | None = None) -> bool:
        """True when a trajectory that started at ``start_version`` may no longer be trained on."""
        v = self._clock.value if version is None else version
        return v - start_version > self.max_staleness

    # ------------------------------------------------------------------ transitions

    def set_version(self, version: int) -> None:
        with self._lock:
            self._clock.value = int(version)

    def on_version_recovered(self, version: int) -> None:
        """After a restart at ``version``: v·B trajectories were consumed, nothing is running."""
        with self._lock:
            self._clock.value = int(version)
            consumed = self._clock.value * self.batch_size
            self._stat = RolloutStat(submitted=consumed, accepted=consumed)

    def restore_counts(self, failed: int = 0, rejected: int = 0) -> None:
        """After ``on_version_recovered``: the failed and rejected episodes of the run so far
        (they hold no place in the budget; restored so the counters go on, not restart)."""
        with self._lock:
            self._stat.failed, self._stat.rejected = int(failed), int(rejected)

    def on_submit(self) -> None:
        with self._lock:
            self._stat.submitted += 1

    def try_start(self) -> bool:
        """Admit one episode if capacity allows (check and count atomically)."""
        with self._lock:
            if self._capacity_locked() <= 0:
                return False
            self._stat.running += 1
            return True

    def on_accept(self) -> None:
        with self._lock:
            self._stat.running -= 1
            self._stat.accepted += 1

    def on_reject(self) -> None:
        """The workflow returned None: the slot is free again."""
        with self._lock:
            self._stat.running -= 1
            self._stat.rejected += 1

    def on_fail(self) -> None:
        """The workflow raised: counted, slot freed."""
        with self._lock:
            self._stat.running -= 1
            self._stat.failed += 1

    def on_drop_accepted(self) -> None:
        """A trajectory already counted as accepted was discarded at consumption (rejected by
        ``should_accept`` or stale): it no longer holds a place in the budget."""
        with self._lock:
            self._stat.accepted -= 1
            self._stat.rejected += 1


def take_oldest(results: deque, group: Any, n: int | None) -> tuple[list, deque]:
    """Split ``results`` (items with ``.group`` and ``.start_version``) into up to ``n`` of
    ``group`` to consume and the rest. When more are ready than needed the oldest starts go
    first: they are the ones the next version would make stale (a drop throws away their
    generation); younger ones wait a step and are still in time. Each keeps its queue order."""
    mine = [r for r in results if r.group == group]
    if n is not None and len(mine) > n:
        chosen = {id(r) for r in sorted(mine, key=lambda r: r.start_version)[:n]}
        mine = [r for r in mine if id(r) in chosen]
    picked = {id(r) for r in mine}
    return mine, deque(r for r in results if id(r) not in picked)


def generated_tokens(traj: Any) -> int:
    """Generated (loss-mask) tokens of a trajectory dict; 0 when it has no ``loss_mask``."""
    lm = traj.get("loss_mask") if isinstance(traj, dict) else None
    return int(lm.sum()) if lm is not None else 0
