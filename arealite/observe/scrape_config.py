"""The Prometheus scrape config of a run (``{run_dir}/prometheus.yml``), written by the launcher
once the servers are up: every server with ``/metrics`` (``servers.enable_metrics``) and every
trainer rank (``stats_logger.metrics_port`` + rank) as targets. ``deploy/grafana/`` holds the
dashboard that reads them; ``docs/observability.md`` the commands."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SCRAPE_INTERVAL_S = 5


def scrape_targets(config: Any, server_addrs: list[str]) -> dict[str, list[str]]:
    """{job: [host:port, ...]}: ``servers`` when they serve /metrics, ``trainer`` per rank."""
    jobs: dict[str, list[str]] = {}
    sg = getattr(config, "servers", None)
    if server_addrs and sg is not None and sg.enable_metrics:
        jobs["servers"] = list(server_addrs)
    sl = config.stats_logger
    if sl.metrics_port:  # 0 is "any free port": not known here
        host = "127.0.0.1" if sl.metrics_host in ("0.0.0.0", "") else sl.metrics_host
        nproc = config.launcher.trainer_nproc
        jobs["trainer"] = [f"{host}:{sl.metrics_port + r}" for r in range(nproc)]
    return jobs


def render_scrape_config(jobs: dict[str, list[str]], run: str, interval_s: int = SCRAPE_INTERVAL_S) -> str:
    """Prometheus YAML: one job per kind of process, the run's name as a ``run`` label."""
    lines = ["# written by the arealite launcher for this run (docs/observability.md)",
             "global:", f"  scrape_interval: {interval_s}s", f"  evaluation_interval: {interval_s}s",
             "scrape_configs:"]
    for job, targets in jobs.items():
        lines += [f"  - job_name: {job}", "    static_configs:",
                  "      - targets: [" + ", ".join(f"'{t}'" for t in targets) + "]",
                  f"        labels: {{run: '{run}'}}"]
    return "\n".join(lines) + "\n"


def write_scrape_config(config: Any, server_addrs: list[str]) -> Path | None:
    """``{run_dir}/prometheus.yml`` when anything serves /metrics; None otherwise."""
    jobs = scrape_targets(config, server_addrs)
    if not jobs:
        return None
    path = config.run_dir("prometheus.yml")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_scrape_config(jobs, f"{config.experiment_name}/{config.trial_name}"))
    return path
