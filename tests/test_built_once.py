"""tests/support/built_once.py: one build per run, shared by the xdist workers."""

from __future__ import annotations

from pathlib import Path

from tests.support.built_once import built_once


class _Factory:
    """The two calls pytest-xdist's workers would make: their own basetemps under one root."""

    def __init__(self, root: Path, worker: str) -> None:
        self.base = root / f"popen-{worker}"
        self.base.mkdir(parents=True, exist_ok=True)

    def getbasetemp(self) -> Path:
        return self.base

    def mktemp(self, name: str) -> Path:
        out = self.base / name
        out.mkdir()
        return out


def test_built_once_across_workers_and_per_session_without_xdist(tmp_path, monkeypatch):
    calls = []

    def build(out: Path) -> Path:
        calls.append(out)
        (out / "model").write_text("weights")
        return out / "model"

    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    first = built_once(_Factory(tmp_path, "gw0"), "m", build)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    second = built_once(_Factory(tmp_path, "gw1"), "m", build)
    assert first == second == tmp_path / "m" / "model" and len(calls) == 1
    assert first.read_text() == "weights"
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    own = built_once(_Factory(tmp_path / "solo", "main"), "m", build)
    assert own != first and len(calls) == 2  # one process: an ordinary session fixture
