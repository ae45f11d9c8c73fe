"""The trainer's Prometheus ``/metrics`` (``stats_logger.metrics_port``; rank r serves on
``metrics_port + r``, bound to ``stats_logger.metrics_host``, 127.0.0.1 by default).

Two sources, neither on the client's per-request path:
- once per step, after the step's stats are logged: phase times, trainer and rollout idle time,
  staleness, length bias, reward, held-out accuracy, trained tokens, weight-push seconds and bytes
  (``record_step``, a few dozen dictionary reads);
- at scrape time, read from the rollout client: episode counters (accepted, rejected, failed,
  stale, ...), the executor's queues, and per server the requests in flight as the client sees
  them, its health and the calls it served.

Ranks: every rank serves its own numbers (its own executor, its own client). Counters add up
over ranks (``sum by (...)`` in PromQL); per-step gauges that the stats tracker already reduced
over ranks (phase times, eval accuracy) are the same on every rank (``max``/``avg``). The names
are listed in ``docs/observability.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import torch
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from arealite.api.config.run import StatsLoggerConfig

logger = logging.getLogger("arealite.observe.prometheus_metrics")

PHASE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# executor counters (cumulative) exported as episode outcomes; the rest are queue gauges
EPISODE_OUTCOMES = ("submitted", "accepted", "rejected", "failed", "stale", "redrawn", "dropped")
QUEUE_GAUGES = ("running", "pending", "ready", "capacity")


class RolloutCollector(Collector):
    """The rollout client's live state, read when scraped."""

    def __init__(self, rollout: Any) -> None:
        self.rollout = rollout

    def collect(self) -> Iterator[Metric]:
        executor = getattr(self.rollout, "executor", None)
        if executor is not None and executor.gate is not None:
            c = executor.counters()
            ep = CounterMetricFamily("arealite_rollout_episodes",
                                     "Episodes by outcome (cumulative, this rank)", labels=["outcome"])
            for k in EPISODE_OUTCOMES:
                ep.add_metric([k], float(c[k]))
            yield ep
            q = GaugeMetricFamily("arealite_rollout_queue",
                                  "Episodes running, waiting to start (pending), finished and "
                                  "not yet trained on (ready); capacity: the staleness gate's room",
                                  labels=["state"])
            for k in QUEUE_GAUGES:
                q.add_metric([k], float(c[k]))
            yield q
        pool = getattr(self.rollout, "pool", None)
        if pool is None:
            return
        inflight = GaugeMetricFamily("arealite_client_inflight_requests",
                                     "Requests the client has in flight on the server", labels=["server"])
        healthy = GaugeMetricFamily("arealite_client_server_healthy",
                                    "1 while the client routes to the server", labels=["server"])
        served = CounterMetricFamily("arealite_client_served_requests",
                                     "Successful /generate calls the server answered", labels=["server"])
        for addr, s in list(pool.servers.items()):
            inflight.add_metric([addr], float(s.inflight))
            healthy.add_metric([addr], 1.0 if s.healthy else 0.0)
            served.add_metric([addr], float(s.served))
        yield inflight
        yield healthy
        yield served


class TrainerMetrics:
    """Per-step trainer metrics; ``record_step`` after each step's stats are logged."""

    def __init__(self, registry: CollectorRegistry, weight_bytes: int = 0) -> None:
        r = registry
        self.weight_bytes = weight_bytes
        self.step = Gauge("arealite_trainer_step", "Last finished step", registry=r)
        self.version = Gauge("arealite_trainer_weight_version", "Weight version after the last step", registry=r)
        self.steps = Counter("arealite_trainer_steps", "Finished steps", registry=r)
        self.phase = Histogram("arealite_trainer_phase_seconds",
                               "Seconds per step in each phase (timeperf/*; phase=step: the whole step)",
                               ["phase"], buckets=PHASE_BUCKETS, registry=r)
        self.rollout_idle = Counter("arealite_rollout_idle_seconds",
                                    "Seconds with no episode in flight (rollout/idle_s)", registry=r)
        self.tokens = Counter("arealite_trainer_tokens", "Tokens (prompt + generated) trained on", registry=r)
        self.reward = Gauge("arealite_trainer_reward", "Mean reward of the last step's batch", registry=r)
        self.eval_acc = Gauge("arealite_trainer_eval_accuracy", "Last held-out right-answer share (eval/right; an eval_fn's eval/accuracy)", registry=r)
        self.stale_avg = Gauge("arealite_trainer_staleness_avg", "Mean token staleness of the last batch", registry=r)
        self.stale_max = Gauge("arealite_trainer_staleness_max", "Largest token staleness of the last batch", registry=r)
        self.stale_hist = Gauge("arealite_trainer_staleness_fraction",
                                "Share of the last batch's tokens that are k versions stale",
                                ["staleness"], registry=r)
        self.sync_bytes = Counter("arealite_weight_sync_bytes", "Bytes of weights pushed to the servers", registry=r)
        self.sync_seconds = Histogram("arealite_weight_update_seconds",
                                      "Client-side seconds of each weight update (pause to resume on the servers)",
                                      buckets=PHASE_BUCKETS, registry=r)
        self.length_bias = Gauge("arealite_trainer_length_bias",
                                 "Trained against generated lengths (length_bias/*): mean_ratio, "
                                 "p90_ratio, run_mean_ratio (1 = no bias), ks (0 = same "
                                 "distribution), reward_diff", ["stat"], registry=r)
        self.consistency = Gauge(
            "arealite_trainer_consistency",
            "The consistency gate's last figures, worst server (consistency/*: kl_mean, kl_max, "
            "max_logprob_gap, argmax_mismatch, servers_failed, ...)", ["figure"], registry=r)
        self._stale_keys: set[str] = set()

    def record_step(self, step: int, version: int, stats: dict[str, float], rollout: Any = None) -> None:
        self.step.set(step)
        self.version.set(version)
        self.steps.inc()
        for k, v in stats.items():
            if k.startswith("timeperf/") and k != "timeperf/train_elapsed":
                self.phase.labels(k.split("/", 1)[1]).observe(float(v))
        self.rollout_idle.inc(max(0.0, float(stats.get("rollout/idle_s", 0.0))))
        if "perf/tokens_per_sec" in stats and "timeperf/step" in stats:
            self.tokens.inc(max(0.0, stats["perf/tokens_per_sec"] * stats["timeperf/step"]))
        if "reward" in stats:
            self.reward.set(stats["reward"])
        right = stats.get("eval/right", stats.get("eval/accuracy"))
        if right is not None:
            self.eval_acc.set(right)
        if "staleness/avg" in stats:
            self.stale_avg.set(stats["staleness/avg"])
            self.stale_max.set(stats["staleness/max"])
        hist = {k.rsplit("_", 1)[1]: v for k, v in stats.items() if k.startswith("staleness/hist_")}
        for k in self._stale_keys - hist.keys():  # a bucket absent this step holds no token
            self.stale_hist.labels(k).set(0.0)
        for k, v in hist.items():
            self.stale_hist.labels(k).set(v)
        self._stale_keys |= hist.keys()
        for k, v in stats.items():
            if k.startswith("length_bias/") and not k.endswith("_len"):
                self.length_bias.labels(k.split("/", 1)[1]).set(float(v))
            if k.startswith("consistency/"):
                self.consistency.labels(k.split("/", 1)[1]).set(float(v))
        report = getattr(rollout, "last_weight_update", None)
        if report is not None and getattr(report, "version", None) == version:
            self.sync_seconds.observe(report.seconds)
            self.sync_bytes.inc(self.weight_bytes)


class NoMetrics:
    """``metrics_port`` unset: nothing served, nothing recorded."""

    def record_step(self, *args: Any, **kwargs: Any) -> None:
        pass


def weight_bytes(actor: Any, bucket_size_mb: float) -> int:
    """Bytes of one weight push: every parameter once, in its dtype."""
    try:
        specs = [p for bucket in actor.get_param_specs(bucket_size_mb) for p in bucket]
    except Exception:  # noqa: BLE001 - an engine without specs: no byte count
        return 0
    return sum(p.numel * torch.empty(0, dtype=getattr(torch, p.dtype)).element_size() for p in specs)


def start_trainer_metrics(config: StatsLoggerConfig, rank: int, rollout: Any,
                          push_bytes: int = 0) -> TrainerMetrics | NoMetrics:
    """Serve this rank's ``/metrics`` on ``metrics_port + rank`` (a daemon thread)."""
    if config.metrics_port is None:
        return NoMetrics()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RolloutCollector(rollout))
    metrics = TrainerMetrics(registry, push_bytes)
    port = config.metrics_port + rank
    try:
        server, thread = start_http_server(port, addr=config.metrics_host, registry=registry)
    except OSError as e:  # a taken port: say which setting, not a bare socket traceback
        raise RuntimeError(f"stats_logger.metrics_port: rank {rank} cannot serve /metrics on "
                           f"{config.metrics_host}:{port} ({e})") from None
    metrics.server, metrics.thread = server, thread  # type: ignore[attr-defined]
    logger.info("trainer rank %d: Prometheus /metrics on http://%s:%d/metrics", rank,
                config.metrics_host, server.server_port)
    return metrics
