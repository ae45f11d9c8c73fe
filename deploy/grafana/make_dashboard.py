"""Writes ``arealite-dashboard.json`` (Grafana dashboard, schema 39) from the panel list below:
``python deploy/grafana/make_dashboard.py``. The panels' PromQL is what ``make observe`` runs
against a real Prometheus (``benchmarks/studies/observe.py``); keep the two in step by editing here."""

from __future__ import annotations

import json
from pathlib import Path

RATE = "[1m]"
# (title, unit, stacked, [(legend, PromQL), ...]); rows of three panels, eight units wide each
PANELS: list[tuple[str, str, bool, list[tuple[str, str]]]] = [
    ("Throughput (tokens/s)", "short", False, [
        ("trained", f"sum(rate(arealite_trainer_tokens_total{RATE}))"),
        ("generated (servers)", f"sum(rate(sglang:generation_tokens_total{RATE}))"),
    ]),
    ("Trainer idle vs rollout idle (share of wall time)", "percentunit", False, [
        ("trainer waiting for rollouts", f"max(rate(arealite_trainer_phase_seconds_sum{{phase=\"rollout_wait\"}}{RATE}))"),
        ("rollout idle (no episode in flight)", f"avg(rate(arealite_rollout_idle_seconds_total{RATE}))"),
    ]),
    ("Staleness of trained tokens (share per versions behind)", "percentunit", True, [
        ("{{staleness}} behind", "avg by (staleness) (arealite_trainer_staleness_fraction)"),
    ]),
    ("Step time by phase (s)", "s", True, [
        ("{{phase}}", f"max by (phase) (rate(arealite_trainer_phase_seconds_sum{{phase!=\"step\"}}{RATE})"
                      f" / rate(arealite_trainer_phase_seconds_count{{phase!=\"step\"}}{RATE}))"),
    ]),
    ("Weight sync: seconds per push, MB/s", "short", False, [
        ("servers' update (client view), s", f"max(rate(arealite_weight_update_seconds_sum{RATE})"
                                             f" / rate(arealite_weight_update_seconds_count{RATE}))"),
        ("trainer weight_sync phase, s", f"max(rate(arealite_trainer_phase_seconds_sum{{phase=\"weight_sync\"}}{RATE})"
                                         f" / rate(arealite_trainer_phase_seconds_count{{phase=\"weight_sync\"}}{RATE}))"),
        ("MB/s pushed", f"sum(rate(arealite_weight_sync_bytes_total{RATE})) / 1e6"),
    ]),
    ("Reward and held-out accuracy", "short", False, [
        ("reward (batch mean)", "avg(arealite_trainer_reward)"),
        ("held-out accuracy", "max(arealite_trainer_eval_accuracy)"),
    ]),
    ("Server health (client view) and pause", "short", False, [
        ("healthy {{server}}", "max by (server) (arealite_client_server_healthy)"),
        ("paused {{instance}}", "max by (instance) (arealite:paused)"),
    ]),
    ("Server load: running, queued, in flight (client view)", "short", False, [
        ("running {{instance}}", "sum by (instance) (sglang:num_running_reqs)"),
        ("queued {{instance}}", "sum by (instance) (sglang:num_queue_reqs)"),
        ("in flight {{server}}", "sum by (server) (arealite_client_inflight_requests)"),
    ]),
    ("Episodes per second by outcome; staleness gate", "short", False, [
        ("{{outcome}}", f"sum by (outcome) (rate(arealite_rollout_episodes_total{{outcome=~\"accepted|rejected|failed|stale\"}}{RATE}))"),
        ("queue: {{state}}", "sum by (state) (arealite_rollout_queue)"),
    ]),
    ("Server latency: time to first token, end to end (p50, s)", "s", False, [
        ("TTFT p50", f"histogram_quantile(0.5, sum by (le) (rate(sglang:time_to_first_token_seconds_bucket{RATE})))"),
        ("e2e p50", f"histogram_quantile(0.5, sum by (le) (rate(sglang:e2e_request_latency_seconds_bucket{RATE})))"),
    ]),
    ("Server KV usage and generation throughput", "short", False, [
        ("token usage {{instance}}", "max by (instance) (sglang:token_usage)"),
        ("gen tok/s {{instance}}", "max by (instance) (sglang:gen_throughput)"),
    ]),
    ("Length bias: trained / generated (1 = none); KS distance (0 = none)", "short", False, [
        ("{{stat}}", "avg by (stat) (arealite_trainer_length_bias{stat=~\"mean_ratio|p90_ratio|run_mean_ratio|ks\"})"),
    ]),
    ("Server-trainer consistency gate (worst server; thresholds: weight_update.consistency)", "short", False, [
        ("KL(server||trainer) top-k+tail, mean", "max(arealite_trainer_consistency{figure=\"kl_mean\"})"),
        ("argmax differs (share)", "max(arealite_trainer_consistency{figure=\"argmax_mismatch\"})"),
        ("max |dlogp| top-k", "max(arealite_trainer_consistency{figure=\"max_logprob_gap\"})"),
        ("servers failed", "max(arealite_trainer_consistency{figure=\"servers_failed\"})"),
    ]),
    ("Staleness: mean and max; weight version", "short", False, [
        ("mean", "avg(arealite_trainer_staleness_avg)"),
        ("max", "max(arealite_trainer_staleness_max)"),
        ("trainer version", "max(arealite_trainer_weight_version)"),
        ("server version {{instance}}", "max by (instance) (arealite:weight_version)"),
    ]),
]


def queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of every panel."""
    return [(title, expr) for title, _, _, targets in PANELS for _, expr in targets]


def dashboard() -> dict:
    panels = []
    for i, (title, unit, stacked, targets) in enumerate(PANELS):
        panels.append({
            "id": i + 1, "type": "timeseries", "title": title,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"x": 8 * (i % 3), "y": 8 * (i // 3), "w": 8, "h": 8},
            "fieldConfig": {"defaults": {"unit": unit, "custom": {
                "stacking": {"mode": "normal" if stacked else "none"},
                "fillOpacity": 60 if stacked else 10}}, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom"},
                        "tooltip": {"mode": "multi"}},
            "targets": [{"refId": chr(65 + k), "expr": expr, "legendFormat": legend,
                         "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                        for k, (legend, expr) in enumerate(targets)],
        })
    return {
        "title": "arealite: async RL run", "uid": "arealite-run", "schemaVersion": 39,
        "version": 1, "editable": True, "refresh": "10s", "tags": ["arealite"],
        "time": {"from": "now-30m", "to": "now"},
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus",
                                 "label": "Prometheus"}]},
        "panels": panels,
    }


if __name__ == "__main__":
    out = Path(__file__).with_name("arealite-dashboard.json")
    out.write_text(json.dumps(dashboard(), indent=1) + "\n")
    print(f"wrote {out} ({len(PANELS)} panels, {len(queries())} queries)")
