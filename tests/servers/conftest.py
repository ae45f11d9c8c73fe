"""Fixtures for the servers/ tests: SGLang's wire types (contract extra) and a shared server."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

import pytest


def load_api_types():
    """``sglang.api.v1.api_types`` without running sglang's heavy ``__init__`` (protocol §9)."""
    if "sglang.api.v1.api_types" in sys.modules:
        return sys.modules["sglang.api.v1.api_types"]
    spec = importlib.util.find_spec("sglang") if "sglang" not in sys.modules else None
    if "sglang" not in sys.modules:
        if spec is None or not spec.submodule_search_locations:
            return None
        if importlib.util.find_spec("msgspec") is None:
            return None
        shim = types.ModuleType("sglang")
        shim.__path__ = list(spec.submodule_search_locations)
        sys.modules["sglang"] = shim
    try:
        return importlib.import_module("sglang.api.v1.api_types")
    except ImportError:
        return None


@pytest.fixture(scope="session")
def api_types():
    mod = load_api_types()
    if mod is None:
        pytest.skip("sglang (--no-deps) + msgspec not installed: contract extra missing")
    return mod


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    """One embedded server on the tiny model for a test module (fixed seed)."""
    from tests.procs import embedded_server

    with embedded_server(str(tiny_model_dir), ["--random-seed", "0"]) as addr:
        yield f"http://{addr}"
