"""The test run's file order (a pytest plugin; tests/conftest.py loads it): files holding a test
marked ``long`` first, each file's tests kept together and in order.

``make test`` runs ``pytest -n 2 --dist loadfile``: each xdist worker takes whole files from the
front of one queue. A minute-long file taken last ends the run on one worker while the other has
nothing left, so the long files go first and the many short ones fill in behind them.

pytest-xdist (3.6 and later) re-sorts that queue by default, most tests a file first
(``--loadscope-reorder``): the long files, one or two tests each, went last. This plugin turns
the re-sort off; the queue is then the collection order made here."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist is installed
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    long_files = {item.path for item in items if item.get_closest_marker("long")}
    items.sort(key=lambda item: item.path not in long_files)  # stable: the rest keep their order
