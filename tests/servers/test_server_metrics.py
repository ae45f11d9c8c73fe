"""``/metrics`` of a server and of the gateway: Prometheus text that ``prometheus_client``'s
own parser reads, with the documented names, and counters that move when work is done."""

from __future__ import annotations

import sys

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from servers.net import find_free_port, wait_healthy

pytestmark = pytest.mark.integration

MODEL = "model_name"


def scrape(base: str) -> dict[str, dict]:
    """{family name: {sample name + sorted labels: value}} from ``base/metrics``."""
    r = requests.get(f"{base}/metrics", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out: dict[str, dict] = {}
    for fam in text_string_to_metric_families(r.text):
        out[fam.name] = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in fam.samples}
    return out


def one(fams: dict[str, dict], family: str, sample: str | None = None, **labels: str) -> float:
    want = tuple(sorted(labels.items()))
    hits = [v for (name, lab), v in fams[family].items()
            if name == (sample or family) and all(x in lab for x in want)]
    assert len(hits) == 1, (family, sample, labels, fams[family])
    return hits[0]


def test_server_and_gateway_metrics(tiny_model_dir):
    from tests.support.procs import embedded_server, log_tail, spawn

    with embedded_server(str(tiny_model_dir), ["--enable-metrics"]) as addr:
        base = f"http://{addr}"
        before = scrape(base)
        for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:gen_throughput",
                     "sglang:token_usage", "sglang:prompt_tokens", "sglang:generation_tokens",
                     "sglang:num_requests", "sglang:time_to_first_token_seconds",
                     "sglang:e2e_request_latency_seconds", "arealite:weight_version",
                     "arealite:paused", "arealite:weight_updates", "arealite:weight_update_seconds"):
            assert name in before, name
        assert one(before, "arealite:paused") == 0.0

        port = find_free_port()
        gw_cmd = [sys.executable, "-m", "servers.gateway", "--servers", addr, "--port", str(port),
                  "--health-check-interval", "0.5"]
        with spawn(gw_cmd) as (gw, gw_log):
            gbase = f"http://127.0.0.1:{port}"
            assert wait_healthy(f"{gbase}/health", 60, alive=lambda: gw.poll() is None), log_tail(gw_log)
            g0 = scrape(gbase)
            body = {"input_ids": [3, 4], "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}
            for _ in range(3):
                assert requests.post(f"{gbase}/generate", json=body, timeout=60).status_code == 200
            assert requests.post(f"{gbase}/update_weight_version", json={"new_version": "5"},
                                 timeout=30).status_code == 200
            g1 = scrape(gbase)
            url = f"http://{addr}"
            sent = "arealite_gateway_generate_requests"
            assert one(g1, sent, sent + "_total", worker=url) - one(g0, sent, sent + "_total", worker=url) == 3
            assert one(g1, "arealite_gateway_worker_healthy", worker=url) == 1.0
            fan = "arealite_gateway_fanout_calls"
            assert one(g1, fan, fan + "_total", path="/update_weight_version") == 1.0

        assert requests.post(f"{base}/pause_generation", json={"mode": "in_place"}, timeout=30).status_code == 200
        after = scrape(base)
        assert requests.post(f"{base}/continue_generation", json={}, timeout=30).status_code == 200
        for c in ("sglang:num_requests", "sglang:generation_tokens", "sglang:prompt_tokens"):
            assert one(after, c, c + "_total") - one(before, c, c + "_total") >= 3, c
        assert one(after, "sglang:generation_tokens", "sglang:generation_tokens_total") >= 12
        ttft = "sglang:time_to_first_token_seconds"
        assert one(after, ttft, ttft + "_count") - one(before, ttft, ttft + "_count") == 3
        assert one(after, ttft, ttft + "_bucket", le="+Inf") == one(after, ttft, ttft + "_count")
        assert one(after, "arealite:weight_version") == 5.0
        assert one(after, "arealite:paused") == 1.0
