"""Session fixtures built once per test run, also when pytest-xdist runs the tests in several
worker processes (``make test`` does): each worker has its own session, so a plain session
fixture would train the same model once per worker. The first worker to ask builds it under a
file lock in the folder the workers' temporary folders share; the others wait and reuse it."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str,
               build: Callable[[Path], Path]) -> Path:
    """``build(empty_dir)`` once for the whole run; returns what it returned (a path)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:  # one process: an ordinary session fixture
        return build(tmp_path_factory.mktemp(name))
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent  # pytest-of-<user>/pytest-N, the run's root
    done = shared / f"{name}.built"  # holds the path build() returned; written last
    with FileLock(str(shared / f"{name}.lock")):
        if not done.is_file():
            out = shared / name
            shutil.rmtree(out, ignore_errors=True)  # a build that failed in another worker
            out.mkdir()
            done.write_text(str(build(out)))
    return Path(done.read_text())
