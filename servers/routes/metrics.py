"""``/metrics`` (``--enable-metrics``) through ``prometheus_client``, with SGLang's ``sglang:``
names where SGLang has the metric and ``arealite:`` names for ours (weight version, pause state,
weight-update time).

Nothing here runs on the engine's step: the collector reads the engine's counters when a
scraper asks, and the two latency histograms are filled once per finished request.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from servers.engine.latency_histogram import LatencyHistogram

if TYPE_CHECKING:
    from servers.state import ServerState

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def histogram_family(hist: LatencyHistogram, name: str, doc: str,
                     labels: dict[str, str]) -> HistogramMetricFamily:
    """One engine histogram as Prometheus's cumulative buckets (``+Inf`` last) and sum."""
    counts, total = hist.snapshot()
    cum, acc = [], 0
    for bound, c in zip([*map(str, hist.bounds), "+Inf"], counts):
        acc += c
        cum.append((bound, acc))
    fam = HistogramMetricFamily(name, doc, labels=list(labels))
    fam.add_metric(list(labels.values()), cum, total)
    return fam


class ServerCollector(Collector):
    """Every family of one server, built from its engine's state at scrape time."""

    def __init__(self, state: ServerState) -> None:
        self.state = state

    def collect(self) -> Iterator[Metric]:
        st = self.state
        eng = st.engine
        labels = {"model_name": st.args.served_model_name or st.model_path}
        keys, vals = list(labels), list(labels.values())
        load = eng.load()
        s = eng.stats
        held = load["num_running_reqs"] + load["num_queue_reqs"] if eng.paused_mode else 0
        gauges = [
            ("sglang:num_running_reqs", "Running requests", load["num_running_reqs"]),
            ("sglang:num_queue_reqs", "Queued requests", load["num_queue_reqs"]),
            ("sglang:num_paused_reqs", "Requests held by a pause", held),
            ("sglang:gen_throughput", "Generation throughput (tokens/s)", eng.gen_throughput()),
            ("sglang:token_usage", "Fraction of KV slots in use",
             load["num_running_reqs"] / max(1, eng.max_running)),
            ("arealite:weight_version", "Served weight version (-1 when not a number)",
             _as_number(eng.weight_version)),
            ("arealite:paused", "1 while generation is paused (pause_generation)",
             1.0 if eng.paused_mode else 0.0),
        ]
        for name, doc, value in gauges:
            g = GaugeMetricFamily(name, doc, labels=keys)
            g.add_metric(vals, float(value))
            yield g
        counters = [
            ("sglang:prompt_tokens", "Prompt tokens", s["prompt_tokens_total"]),
            ("sglang:generation_tokens", "Generated tokens", s["generation_tokens_total"]),
            ("sglang:num_requests", "Requests received", s["num_requests_total"]),
            ("sglang:num_aborted_requests", "Aborted requests", s["num_aborted_requests_total"]),
            ("sglang:forward_passes", "Model forward passes", s["forward_passes_total"]),
            ("arealite:weight_updates", "Successful weight updates", s["weight_updates_total"]),
            ("arealite:weight_update_seconds", "Seconds spent loading new weights",
             s["weight_load_seconds_sum"]),
        ]
        for name, doc, value in counters:
            c = CounterMetricFamily(name, doc, labels=keys)
            c.add_metric(vals, float(value))
            yield c
        yield histogram_family(eng.ttft_hist, "sglang:time_to_first_token_seconds",
                               "Time to first token (seconds)", labels)
        yield histogram_family(eng.e2e_hist, "sglang:e2e_request_latency_seconds",
                               "End-to-end request latency (seconds)", labels)


def _as_number(version: str) -> float:
    try:
        return float(int(version))
    except (TypeError, ValueError):
        return -1.0


def server_registry(state: ServerState) -> CollectorRegistry:
    """A registry of its own per server (tests run several servers in one process)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(ServerCollector(state))
    return reg


def render_metrics(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
