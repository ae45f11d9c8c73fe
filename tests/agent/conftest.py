"""Fixtures for the agent tests: a tiny model taught to call the calculator tool."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tool_model_dir(tiny_model_dir, tmp_path_factory) -> Path:
    from tests.agent.tool_model import CONVERSATION, THINK_CONVERSATION, teach, think_template

    return teach(Path(tiny_model_dir), tmp_path_factory.mktemp("tool_model"),
                 [CONVERSATION, THINK_CONVERSATION], templates=[None, think_template()])


@pytest.fixture(scope="module")
def tool_server(tool_model_dir):
    """An embedded server on the tool model, parsing Qwen2.5 tool calls; yields ``host:port``."""
    from tests.procs import embedded_server

    with embedded_server(str(tool_model_dir),
                         ["--random-seed", "0", "--tool-call-parser", "qwen25",
                          "--weight-version", "0"]) as addr:
        yield addr
