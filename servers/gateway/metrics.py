"""The gateway's ``/metrics`` (``prometheus_client``): per worker its health and the routed
calls (``/generate``, and ``/classify``, ``/encode`` of a reward-model pool) it was sent,
answered and failed, plus control calls fanned out. Read from the gateway's own records when
scraped; nothing is added to the proxied request's path but two integer increments."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from servers.gateway.workers import Gateway


class GatewayCollector(Collector):
    def __init__(self, gw: Gateway) -> None:
        self.gw = gw

    def collect(self) -> Iterator[Metric]:
        workers = list(self.gw.workers.values())
        healthy = GaugeMetricFamily("arealite_gateway_worker_healthy",
                                    "1 while the worker passes its health checks", labels=["worker"])
        sent = CounterMetricFamily("arealite_gateway_generate_requests",
                                   "/generate, /classify and /encode calls sent to the worker", labels=["worker"])
        failed = CounterMetricFamily("arealite_gateway_generate_failures",
                                     "Routed calls (/generate, /classify, /encode) the worker could not be reached for",
                                     labels=["worker"])
        for w in workers:
            healthy.add_metric([w.url], 1.0 if w.healthy else 0.0)
            sent.add_metric([w.url], float(w.sent))
            failed.add_metric([w.url], float(w.unreachable))
        yield healthy
        yield sent
        yield failed
        n = GaugeMetricFamily("arealite_gateway_workers", "Workers known to the gateway",
                              labels=["state"])
        n.add_metric(["healthy"], float(sum(w.healthy for w in workers)))
        n.add_metric(["total"], float(len(workers)))
        yield n
        yield CounterMetricFamily("arealite_gateway_no_worker",
                                  "Routed calls answered 503: no healthy worker",
                                  value=float(self.gw.no_worker))
        fan = CounterMetricFamily("arealite_gateway_fanout_calls",
                                  "Control calls fanned out to every worker", labels=["path"])
        for path, k in sorted(self.gw.fanouts.items()):
            fan.add_metric([path], float(k))
        yield fan


def gateway_registry(gw: Gateway) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(GatewayCollector(gw))
    return reg
