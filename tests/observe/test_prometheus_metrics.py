"""The trainer's metrics without a run: a step's stats become the documented families, and a
port that is taken is a one-line error naming the setting."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from arealite.api.config.run import StatsLoggerConfig
from arealite.observe.prometheus_metrics import (
    NoMetrics,
    RolloutCollector,
    TrainerMetrics,
    start_trainer_metrics,
)


def samples(reg: CollectorRegistry) -> dict[tuple[str, tuple], float]:
    text = generate_latest(reg).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def test_a_step_becomes_metrics():
    reg = CollectorRegistry()
    m = TrainerMetrics(reg, weight_bytes=1000)
    pool = SimpleNamespace(servers={"h:1": SimpleNamespace(inflight=3, healthy=True, served=7)})
    reg.register(RolloutCollector(SimpleNamespace(pool=pool)))
    rollout = SimpleNamespace(last_weight_update=SimpleNamespace(version=1, seconds=0.25))
    stats = {"timeperf/step": 2.0, "timeperf/update": 1.5, "timeperf/train_elapsed": 9.0,
             "rollout/idle_s": 0.5, "perf/tokens_per_sec": 100.0, "reward": 0.75,
             "staleness/avg": 0.5, "staleness/max": 1, "staleness/hist_0": 0.5, "staleness/hist_1": 0.5,
             "length_bias/mean_ratio": 0.96, "length_bias/ks": 0.1, "length_bias/gen_mean_len": 9.0}
    m.record_step(1, 1, stats, rollout)
    m.record_step(2, 2, {**stats, "staleness/hist_1": 0.0, "eval/accuracy": 0.9,
                         "consistency/kl_mean": 0.03, "consistency/servers_failed": 1.0}, rollout)  # stale report
    s = samples(reg)
    assert s[("arealite_trainer_steps_total", ())] == 2
    assert s[("arealite_trainer_phase_seconds_count", (("phase", "update"),))] == 2
    assert ("arealite_trainer_phase_seconds_count", (("phase", "train_elapsed"),)) not in s
    assert s[("arealite_trainer_tokens_total", ())] == 400
    assert s[("arealite_rollout_idle_seconds_total", ())] == 1.0
    assert s[("arealite_trainer_eval_accuracy", ())] == 0.9
    assert s[("arealite_trainer_consistency", (("figure", "kl_mean"),))] == 0.03
    assert s[("arealite_trainer_consistency", (("figure", "servers_failed"),))] == 1.0
    assert s[("arealite_trainer_staleness_fraction", (("staleness", "1"),))] == 0.0
    assert s[("arealite_weight_sync_bytes_total", ())] == 1000  # one report of version 1 only
    assert s[("arealite_weight_update_seconds_count", ())] == 1
    assert s[("arealite_client_inflight_requests", (("server", "h:1"),))] == 3
    assert s[("arealite_client_served_requests_total", (("server", "h:1"),))] == 7
    assert s[("arealite_trainer_length_bias", (("stat", "mean_ratio"),))] == 0.96
    assert s[("arealite_trainer_length_bias", (("stat", "ks"),))] == 0.1
    assert ("arealite_trainer_length_bias", (("stat", "gen_mean_len"),)) not in s  # a length


def test_off_by_default_and_a_taken_port_is_a_clear_error():
    assert isinstance(start_trainer_metrics(StatsLoggerConfig(), 0, None), NoMetrics)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(RuntimeError, match=f"rank 0 cannot serve /metrics on 127.0.0.1:{port}"):
            start_trainer_metrics(StatsLoggerConfig(metrics_port=port), 0, None)
