"""The chaos benchmark's costliest fault, in the suite: a server killed inside a weight update.
The run must finish every step, lose nothing and leave no process behind."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.integration


def test_server_killed_mid_weight_update_costs_no_prompt(tmp_path):
    from benchmarks.chaos import main

    out = tmp_path / "chaos.json"
    args = ["--quick", "--scenarios", "server-mid-update", "--json", str(out),
            "--root", str(tmp_path / "runs")]
    assert main(args) == 0
    base, hit = json.loads(out.read_text())["async"]
    assert hit["scenario"] == "server-mid-update"
    assert hit["exit"] == 0 and hit["steps"] == base["steps"] == 12
    assert hit["lost"] == 0 and hit["dropped"] == 0 and hit["left_behind"] == []
    # not the multiset of prompts: an async run trains in completion order, and a stale drop
    # (re-drawn) can move a prompt past the last step; nothing is lost either way
    assert hit["final_version"] == base["final_version"]
