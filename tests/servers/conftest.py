"""Fixtures for the servers/ tests: SGLang's wire types (contract extra) and a shared server."""

from __future__ import annotations

import pytest

from tests.support.sglang_types import load_api_types


@pytest.fixture(scope="session")
def api_types():
    mod = load_api_types()
    if mod is None:
        pytest.skip("sglang (--no-deps) + msgspec not installed: contract extra missing")
    return mod


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    """One embedded server on the tiny model for a test module (fixed seed)."""
    from tests.support.procs import embedded_server

    with embedded_server(str(tiny_model_dir), ["--random-seed", "0"]) as addr:
        yield f"http://{addr}"
