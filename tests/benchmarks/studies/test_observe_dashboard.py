"""The shipped dashboard: the JSON is what ``deploy/grafana/make_dashboard.py`` writes, and every
metric its queries read is one that docs/observability.md documents (``make observe`` runs the
queries against a real Prometheus)."""

from __future__ import annotations

import json
import re
import runpy
from pathlib import Path

from benchmarks.studies.observe import DASHBOARD, dashboard_queries

ROOT = Path(__file__).parents[3]


def test_dashboard_json_is_current():
    mod = runpy.run_path(str(ROOT / "deploy" / "grafana" / "make_dashboard.py"), run_name="dash")
    assert json.loads(DASHBOARD.read_text()) == mod["dashboard"]()
    assert [q for _, q in dashboard_queries()] == [q for _, q in mod["queries"]()]


def test_every_queried_metric_is_documented():
    doc = (ROOT / "docs" / "observability.md").read_text()
    names = set()
    for _, expr in dashboard_queries():
        names |= set(re.findall(r"\b((?:sglang|arealite):?[a-z_:]+?)(?:_bucket|_sum|_count)?\b(?=[{\[)\s])", expr))
    assert len(names) >= 15, names
    for name in names:
        base = re.sub(r"_total$", "", name)
        assert f"`{base}" in doc or f"`{name}" in doc, name
