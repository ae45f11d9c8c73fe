"""DataCycle: endless iteration over a dataloader's batches."""

import pytest

from arealite.rollout.data_cycle import DataCycle


def test_cycles_epochs_and_normalises_items():
    loader = [[{"id": 0}, {"id": 1}], ({"id": 2},), {"id": 3}]
    dc = DataCycle()
    got = [dc.next_rows(loader) for _ in range(7)]
    assert [[r["id"] for r in rows] for rows in got] == [[0, 1], [2], [3], [0, 1], [2], [3], [0, 1]]
    assert dc.epochs_started == 3
    other = [[{"id": 9}]]
    assert dc.next_rows(other) == [{"id": 9}] and dc.epochs_started == 1  # a new loader restarts


def test_empty_or_malformed_loader():
    with pytest.raises(ValueError, match="no batches"):
        DataCycle().next_rows([])
    with pytest.raises(TypeError, match="list of rows"):
        DataCycle().next_rows(["not rows"])
