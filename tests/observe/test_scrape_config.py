"""The scrape config the launcher writes for a run: every server with /metrics and every
trainer rank as targets, in YAML Prometheus reads."""

from __future__ import annotations

import yaml

from arealite.api.config.experiment import GRPOConfig
from arealite.observe.scrape_config import scrape_targets, write_scrape_config


def test_targets_and_file(tmp_path):
    cfg = GRPOConfig.model_validate({
        "cluster": {"fileroot": str(tmp_path)}, "experiment_name": "e", "trial_name": "t",
        "servers": {"enable_metrics": True}, "launcher": {"trainer_nproc": 2},
        "stats_logger": {"metrics_port": 9400}})
    assert scrape_targets(cfg, ["127.0.0.1:1", "127.0.0.1:2"]) == {
        "servers": ["127.0.0.1:1", "127.0.0.1:2"], "trainer": ["127.0.0.1:9400", "127.0.0.1:9401"]}
    path = write_scrape_config(cfg, ["127.0.0.1:1"])
    assert path == tmp_path / "e" / "t" / "prometheus.yml"
    doc = yaml.safe_load(path.read_text())
    jobs = {j["job_name"]: j["static_configs"][0] for j in doc["scrape_configs"]}
    assert jobs["trainer"]["targets"] == ["127.0.0.1:9400", "127.0.0.1:9401"]
    assert jobs["servers"]["labels"] == {"run": "e/t"} and doc["global"]["scrape_interval"] == "5s"


def test_nothing_to_scrape(tmp_path):
    cfg = GRPOConfig.model_validate({"cluster": {"fileroot": str(tmp_path)}})
    assert scrape_targets(cfg, ["127.0.0.1:1"]) == {}
    assert write_scrape_config(cfg, ["127.0.0.1:1"]) is None


def test_shipped_example_is_what_the_launcher_writes():
    from pathlib import Path

    from arealite.observe.scrape_config import render_scrape_config

    example = Path(__file__).parents[2] / "deploy" / "grafana" / "prometheus.example.yml"
    jobs = {"servers": ["127.0.0.1:30000", "127.0.0.1:30001"], "trainer": ["127.0.0.1:9400", "127.0.0.1:9401"]}
    assert example.read_text() == render_scrape_config(jobs, "toy-grpo/trial0")
