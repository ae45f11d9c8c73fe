"""Endless iteration over a dataloader: each item is a list of row dicts; when an epoch ends the
sampler is told the next epoch (``set_epoch``, so every epoch has its own shuffle) and a new
iterator is created. Resuming a ``StatefulDataLoader`` mid-epoch is the dataloader's own
business; what it cannot know is kept here and saved by the trainer:

- ``epoch``: the index of the epoch being read (a ``DistributedSampler`` does not save it, and
  its permutation depends on it);
- ``replay``: rows taken from the loader before a checkpoint but not trained on by then (the
  async executor's in-flight rows). A restored cycle hands them out first.

Rows whose episode failed (or went stale) come back through ``redraw`` and are handed out again
before any new row, with the number of attempts made so far, so a prompt is either trained on,
drawn again or (after its last attempt) dropped and counted with its reason: never silently
lost. Every row handed out carries the epoch it was drawn in and its attempts (a "tagged row",
``(row, attempts, epoch)``) through re-draws and replays, also across a restart, so the run's
ledger (``observe/sample_log.py``) can say which epoch's row each step trained or dropped.

``DataloaderFeed`` is the executor's side of it: what ``prepare_batch`` pulls, and which rows
are in flight when a checkpoint is taken.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Sequence
from typing import Any

# (row, attempts so far, epoch it was drawn in)
Tagged = tuple[Any, int, int]

logger = logging.getLogger(__name__)


def _set_epoch(dataloader: Any, epoch: int) -> None:
    sampler = getattr(dataloader, "sampler", None)
    if callable(getattr(sampler, "set_epoch", None)):
        sampler.set_epoch(epoch)


class DataCycle:
    def __init__(self) -> None:
        self._loader: Any = None
        self._it: Any = None
        self.epoch = 0  # the epoch being read (restored by load_state_dict)
        self.epochs_started = 0  # epochs started with the current loader
        self._replay: deque[Tagged] = deque()
        self.redrawn = self.dropped = 0  # failed rows handed out again / given up on
        self.dropped_by: Counter[str] = Counter()  # the drops by reason ("failed", "stale")
        # drops not yet written to the ledger (take_dropped); saved with a checkpoint so a drop
        # between the step's ledger line and its checkpoint is not lost from the record
        self._drops: list[dict[str, Any]] = []
        self._retry: deque[Tagged] = deque()  # appended by the executor's loop thread:
        # deque append/popleft are atomic, no lock needed

    def _start_epoch(self, dataloader: Any) -> None:
        _set_epoch(dataloader, self.epoch)
        self._it = iter(dataloader)
        self.epochs_started += 1

    def redraw(self, row: Any, attempts: int, limit: int, epoch: int = -1,
               reason: str = "failed") -> None:
        """``row``'s episode failed (``reason``) after ``attempts`` earlier failures: hand it
        out again, or, once ``limit`` re-draws were spent, drop it (counted and logged)."""
        if attempts < limit:
            self._retry.append((row, attempts + 1, epoch))
            self.redrawn += 1
        else:
            self.drop(row, attempts + 1, epoch, reason)
            logger.error("dropping a prompt after %d failed episodes (rollout.episode_retries=%d, "
                         "last: %s)", attempts + 1, limit, reason)

    def drop(self, row: Any, attempts: int, epoch: int, reason: str) -> None:
        """Count ``row`` as given up on after ``attempts`` episodes, and keep it for the ledger."""
        self.dropped += 1
        self.dropped_by[reason] += 1
        rid = row.get("id") if isinstance(row, dict) else None
        self._drops.append({"id": rid if isinstance(rid, int) else None, "epoch": epoch,
                            "reason": reason, "attempts": attempts})

    def take_dropped(self) -> list[dict[str, Any]]:
        """The drops since the previous call (each ``{"id", "epoch", "reason", "attempts"}``)."""
        out, self._drops = self._drops, []
        return out

    def next_rows_with_attempts(self, dataloader: Any) -> list[Tagged]:
        """``next_rows``, each row tagged with the attempts already made and its epoch: rows to
        draw again come first, then rows to replay, then new rows (0 attempts)."""
        n = getattr(dataloader, "batch_size", None) or 1
        out: list[Tagged] = []
        while self._retry and len(out) < n:
            try:
                out.append(self._retry.popleft())
            except IndexError:  # taken meanwhile: nothing else takes them, but be safe
                break
        if out:
            return out
        return self._next_tagged(dataloader)

    def next_rows(self, dataloader: Any) -> list[Any]:
        """The next item of ``dataloader`` as a list of rows (a lone dict counts as one row);
        rows to replay come first, in chunks of at most the loader's batch size."""
        return [row for row, _, _ in self._next_tagged(dataloader)]

    def _next_tagged(self, dataloader: Any) -> list[Tagged]:
        if self._replay:
            n = getattr(dataloader, "batch_size", None) or len(self._replay)
            return [self._replay.popleft() for _ in range(min(n, len(self._replay)))]
        if dataloader is not self._loader:
            if self._loader is not None:  # a different loader starts from its beginning
                self.epoch = 0
            self._loader, self.epochs_started = dataloader, 0
            self._start_epoch(dataloader)
        try:
            batch = next(self._it)
        except StopIteration:
            # Also the normal case right after resuming from a checkpoint taken at the end of
            # an epoch: the restored iterator has nothing left.
            self.epoch += 1
            self._start_epoch(dataloader)
            try:
                batch = next(self._it)
            except StopIteration:
                raise ValueError("the dataloader yields no batches") from None
        if isinstance(batch, dict):
            batch = [batch]
        if not isinstance(batch, (list, tuple)):
            raise TypeError(f"a dataloader item must be a list of rows, got {type(batch).__name__}")
        return [(row, 0, self.epoch) for row in batch]

    def replay_tagged(self) -> list[Tagged]:
        """Rows waiting to be drawn again or restored for replay, not handed out yet (tagged)."""
        return list(self._retry) + list(self._replay)

    def replay_rows(self) -> list[Any]:
        """Rows waiting to be drawn again or restored for replay, not handed out yet."""
        return [row for row, _, _ in self.replay_tagged()]

    def state_dict(self, inflight: Sequence[Tagged] = ()) -> dict[str, Any]:
        """What a resumed run needs besides the loader's own state; ``inflight`` are tagged rows
        taken from the loader and not trained on yet (rows waiting to be drawn again or
        replayed are added). ``replay_tags`` holds each replayed row's (attempts, epoch), and
        ``drops`` the drops the ledger has not recorded yet."""
        tagged = [*inflight, *self.replay_tagged()]
        return {"epoch": self.epoch, "replay": [row for row, _, _ in tagged],
                "replay_tags": [[a, e] for _, a, e in tagged], "drops": list(self._drops),
                "redrawn": self.redrawn, "dropped_by": dict(self.dropped_by)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore before the first ``next_rows`` (together with the loader's state). A state
        saved before rows were tagged replays its rows as drawn in the saved epoch."""
        epoch = state.get("epoch", 0)
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"bad data-cycle epoch {epoch!r}")
        rows = list(state.get("replay", []))
        tags = state.get("replay_tags") or [[0, epoch]] * len(rows)
        if len(tags) != len(rows):
            raise ValueError(f"data-cycle state: {len(rows)} rows to replay, {len(tags)} tags")
        self.epoch = epoch
        self._replay = deque((row, int(a), int(e)) for row, (a, e) in zip(rows, tags))
        self._drops = list(state.get("drops", []))
        self.redrawn = int(state.get("redrawn", 0))
        self.dropped_by = Counter(state.get("dropped_by", {}))
        self.dropped = sum(self.dropped_by.values())
        self._loader = self._it = None


class DataloaderFeed:
    """``WorkflowExecutor``'s dataloader side (``prepare_batch``): topping up its input queue
    from the dataloader, which rows are in flight, and the data state a recovery checkpoint
    saves (mixed into the executor, whose queues it reads under its condition lock)."""

    def _top_up(self, dataloader: Any, workflow: Any) -> None:
        """Queue rows until the input queue holds what the gate would start now plus one batch
        waiting behind it (so episodes start the moment the version moves), within its bound."""
        loader_bs = getattr(dataloader, "batch_size", None) or self.gate.batch_size
        while True:
            with self._cond:
                pending = len(self._input)
            target = max(self.gate.capacity(), 0) + self.gate.batch_size
            if pending >= target or pending + loader_bs > self.queue_size:
                return
            for row, attempts, epoch in self._data.next_rows_with_attempts(dataloader):
                self.submit(row, workflow, _attempts=attempts, _epoch=epoch)

    def _taken_tagged(self) -> list[Any]:
        with self._cond:  # one snapshot: an item moves between these under this lock
            return ([(r.data, r.attempts, r.epoch) for r in self._results if r.group is None]
                    + [(p.data, p.attempts, p.epoch) for p in self._running.values()
                       if p.group is None]
                    + [(p.data, p.attempts, p.epoch) for p in self._input if p.group is None])

    def _taken_rows(self) -> list[Any]:
        return [row for row, _, _ in self._taken_tagged()]

    def inflight_data(self) -> list[Any]:
        """Rows that ``prepare_batch`` took from its dataloader and that no returned batch has
        held yet: finished but unconsumed, running, queued, and restored rows not resubmitted
        yet. The dataloader's state is already past them, so a recovery checkpoint saves them
        (``rollout_batch``'s own episodes are never in flight between calls)."""
        return self._taken_rows() + self._data.replay_rows()

    def inflight_tagged(self) -> list[tuple[Any, int]]:
        """``inflight_data()`` with the epoch each row was drawn in: ``(row, epoch)``."""
        with self._cond:
            tagged = self._taken_tagged() + self._data.replay_tagged()
        return [(row, epoch) for row, _, epoch in tagged]

    def data_state(self) -> dict[str, Any]:
        """``prepare_batch``'s position beyond the dataloader's own state: the epoch and the
        in-flight rows (resubmitted first after ``load_data_state``), the drops not in the
        ledger yet, and the executor's counters (so a resumed run's go on from them). Call it
        from the trainer thread between batches, together with ``dataloader.state_dict()``."""
        with self._cond:
            return {**self._data.state_dict(self._taken_tagged()),
                    "counters": self.counter_state()}

    def load_data_state(self, state: dict[str, Any]) -> None:
        """Restore ``data_state()`` (with the dataloader's state) before the first batch."""
        with self._cond:
            self._data.load_state_dict(state)
            self.load_counter_state(state.get("counters", {}))
