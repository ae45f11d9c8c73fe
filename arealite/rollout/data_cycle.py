"""Endless iteration over a dataloader for ``prepare_batch``: each item is a list of row
dicts; when an epoch ends a new iterator is created (shuffling per epoch, and resuming a
``StatefulDataLoader`` mid-epoch, are the dataloader's own business)."""

from __future__ import annotations

from typing import Any


class DataCycle:
    def __init__(self) -> None:
        self._loader: Any = None
        self._it: Any = None
        self.epochs_started = 0

    def next_rows(self, dataloader: Any) -> list[Any]:
        """The next item of ``dataloader`` as a list of rows (a lone dict counts as one row)."""
        if dataloader is not self._loader:
            self._loader, self._it = dataloader, iter(dataloader)
            self.epochs_started = 1
        try:
            batch = next(self._it)
        except StopIteration:
            self._it = iter(dataloader)
            self.epochs_started += 1
            try:
                batch = next(self._it)
            except StopIteration:
                raise ValueError("the dataloader yields no batches") from None
        if isinstance(batch, dict):
            return [batch]
        if not isinstance(batch, (list, tuple)):
            raise TypeError(f"a dataloader item must be a list of rows, got {type(batch).__name__}")
        return list(batch)
