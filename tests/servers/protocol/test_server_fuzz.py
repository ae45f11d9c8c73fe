"""Schema-driven fuzzing of a server and a gateway (tests/support/fuzz_servers.py, small count):
no response >= 500, and the servers generate the same greedy tokens afterwards. The full
10,000-request run and its figures are in docs/reliability.md."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.integration


def test_fuzz_no_server_errors(tiny_model_dir, tmp_path, capsys):
    from tests.support.fuzz_servers import main

    out = tmp_path / "fuzz.json"
    rc = main(["--requests", "400", "--model-path", str(tiny_model_dir), "--json", str(out)])
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert rc == 0, printed
    for app in ("server", "gateway"):
        assert report[app]["requests"] >= 400 and report[app]["failures"] == []
        reached = report[app]["tally"]["POST /generate"]
        assert reached.get("200", 0) > 0, reached  # typed params let some reach the engine
    assert report["health_after"] == [200, 200] and report["same_greedy_tokens_after"]
