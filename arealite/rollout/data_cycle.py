"""Endless iteration over a dataloader: each item is a list of row dicts; when an epoch ends the
sampler is told the next epoch (``set_epoch``, so every epoch has its own shuffle) and a new
iterator is created. Resuming a ``StatefulDataLoader`` mid-epoch is the dataloader's own
business; what it cannot know is kept here and saved by the trainer:

- ``epoch``: the index of the epoch being read (a ``DistributedSampler`` does not save it, and
  its permutation depends on it);
- ``replay``: rows taken from the loader before a checkpoint but not trained on by then (the
  async executor's in-flight rows). A restored cycle hands them out first.

Rows whose episode failed come back through ``redraw`` and are handed out again before any new
row, with the number of attempts made so far, so a prompt is either trained on, drawn again or
(after its last attempt) dropped and counted: never silently lost.

``DataloaderFeed`` is the executor's side of it: what ``prepare_batch`` pulls, and which rows
are in flight when a checkpoint is taken.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from typing import Any

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
        self._replay: deque[Any] = deque()
        self.redrawn = self.dropped = 0  # failed rows handed out again / given up on
        self._retry: deque[tuple[Any, int]] = deque()  # (row, attempts so far), appended by
        # the executor's loop thread: deque append/popleft are atomic, no lock needed

    def _start_epoch(self, dataloader: Any) -> None:
        _set_epoch(dataloader, self.epoch)
        self._it = iter(dataloader)
        self.epochs_started += 1

    def redraw(self, row: Any, attempts: int, limit: int) -> None:
        """``row``'s episode failed after ``attempts`` earlier failures: hand it out again, or,
        once ``limit`` re-draws were spent, drop it (counted and logged)."""
        if attempts < limit:
            self._retry.append((row, attempts + 1))
            self.redrawn += 1
        else:
            self.dropped += 1
            logger.error("dropping a prompt after %d failed episodes (rollout.episode_retries=%d)",
                         attempts + 1, limit)

    def next_rows_with_attempts(self, dataloader: Any) -> list[tuple[Any, int]]:
        """``next_rows``, each row with the attempts already made: rows to draw again come
        first, then rows to replay, then new rows (0 attempts)."""
        n = getattr(dataloader, "batch_size", None) or 1
        out: list[tuple[Any, int]] = []
        while self._retry and len(out) < n:
            try:
                out.append(self._retry.popleft())
            except IndexError:  # taken meanwhile: nothing else takes them, but be safe
                break
        if out:
            return out
        return [(row, 0) for row in self.next_rows(dataloader)]

    def next_rows(self, dataloader: Any) -> list[Any]:
        """The next item of ``dataloader`` as a list of rows (a lone dict counts as one row);
        rows to replay come first, in chunks of at most the loader's batch size."""
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
            return [batch]
        if not isinstance(batch, (list, tuple)):
            raise TypeError(f"a dataloader item must be a list of rows, got {type(batch).__name__}")
        return list(batch)

    def replay_rows(self) -> list[Any]:
        """Rows waiting to be drawn again or restored for replay, not handed out yet."""
        return [row for row, _ in list(self._retry)] + list(self._replay)

    def state_dict(self, inflight: Sequence[Any] = ()) -> dict[str, Any]:
        """What a resumed run needs besides the loader's own state; ``inflight`` are rows taken
        from the loader and not trained on yet (rows waiting to be drawn again or replayed are
        added)."""
        return {"epoch": self.epoch, "replay": [*inflight, *self.replay_rows()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore before the first ``next_rows`` (together with the loader's state)."""
        epoch = state.get("epoch", 0)
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"bad data-cycle epoch {epoch!r}")
        self.epoch = epoch
        self._replay = deque(state.get("replay", []))
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
            for row, attempts in self._data.next_rows_with_attempts(dataloader):
                self.submit(row, workflow, _attempts=attempts)

    def _taken_rows(self) -> list[Any]:
        with self._cond:  # one snapshot: an item moves between these under this lock
            return ([r.data for r in self._results if r.group is None]
                    + [p.data for p in self._running.values() if p.group is None]
                    + [p.data for p in self._input if p.group is None])

    def inflight_data(self) -> list[Any]:
        """Rows that ``prepare_batch`` took from its dataloader and that no returned batch has
        held yet: finished but unconsumed, running, queued, and restored rows not resubmitted
        yet. The dataloader's state is already past them, so a recovery checkpoint saves them
        (``rollout_batch``'s own episodes are never in flight between calls)."""
        return self._taken_rows() + self._data.replay_rows()

    def data_state(self) -> dict[str, Any]:
        """``prepare_batch``'s position beyond the dataloader's own state: the epoch and the
        in-flight rows (resubmitted first after ``load_data_state``). Call it from the trainer
        thread between batches, together with ``dataloader.state_dict()``."""
        return self._data.state_dict(self._taken_rows())

    def load_data_state(self, state: dict[str, Any]) -> None:
        """Restore ``data_state()`` (with the dataloader's state) before the first batch."""
        self._data.load_state_dict(state)
