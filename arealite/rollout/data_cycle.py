"""Endless iteration over a dataloader: each item is a list of row dicts; when an epoch ends the
sampler is told the next epoch (``set_epoch``, so every epoch has its own shuffle) and a new
iterator is created. Resuming a ``StatefulDataLoader`` mid-epoch is the dataloader's own
business; what it cannot know is kept here and saved by the trainer:

- ``epoch``: the index of the epoch being read (a ``DistributedSampler`` does not save it, and
  its permutation depends on it);
- ``replay``: rows taken from the loader before a checkpoint but not trained on by then (the
  async executor's in-flight rows). A restored cycle hands them out first.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any


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

    def _start_epoch(self, dataloader: Any) -> None:
        _set_epoch(dataloader, self.epoch)
        self._it = iter(dataloader)
        self.epochs_started += 1

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
        """Rows restored for replay and not handed out yet."""
        return list(self._replay)

    def state_dict(self, inflight: Sequence[Any] = ()) -> dict[str, Any]:
        """What a resumed run needs besides the loader's own state; ``inflight`` are rows taken
        from the loader and not trained on yet (rows still waiting for replay are added)."""
        return {"epoch": self.epoch, "replay": [*inflight, *self._replay]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore before the first ``next_rows`` (together with the loader's state)."""
        epoch = state.get("epoch", 0)
        if not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"bad data-cycle epoch {epoch!r}")
        self.epoch = epoch
        self._replay = deque(state.get("replay", []))
        self._loader = self._it = None
