"""``make observe``: a real Prometheus against a short run of the main job.

Runs ``arealite main-job`` with the servers' and the trainer's ``/metrics`` on and the trace on,
starts Prometheus (Debian's ``prometheus`` binary, ``make observe`` installs it) on 127.0.0.1
with the scrape config the launcher wrote for the run, checks that every target was scraped,
then runs every PromQL query of the shipped dashboard (``deploy/grafana/arealite-dashboard.json``)
through Prometheus's HTTP API over the run's time span: each must return data. Finally renders
the timeline PNG of the run's trace. Prints a line per target and per query; exit 1 when a
target was never scraped or a query returned nothing.

    python -m benchmarks.studies.observe [--steps 40] [--png docs/images/timeline.png]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from arealite.utils.network import find_free_port

ROOT = Path(__file__).parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "arealite-dashboard.json"


def dashboard_queries(path: Path = DASHBOARD) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target of the dashboard JSON."""
    board = json.loads(path.read_text())
    return [(p["title"], t["expr"]) for p in board["panels"] for t in p["targets"]]


def api(base: str, path: str, **params: Any) -> Any:
    url = f"{base}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    with urllib.request.urlopen(url, timeout=30) as r:
        body = json.loads(r.read())
    if body.get("status") != "success":
        raise RuntimeError(f"{path}: {body}")
    return body["data"]


def wait_for(cond, timeout: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the main job exited ({proc.returncode}) before {what}")
        time.sleep(0.5)
    raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")


def _ready(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def stop_group(proc: subprocess.Popen, grace: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.studies.observe", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40, help="GRPO steps of the main job")
    p.add_argument("--fileroot", default="outputs", help="cluster.fileroot (assets reused from there)")
    p.add_argument("--png", default=None, help="also copy the timeline PNG here")
    args = p.parse_args(argv)
    prom_bin = shutil.which("prometheus")
    if prom_bin is None:
        print("observe: no prometheus binary (make observe installs Debian's package)", file=sys.stderr)
        return 2
    fileroot = Path(args.fileroot).resolve()
    run = fileroot / "toy-grpo" / "observe"
    scrape = run / "prometheus.yml"
    scrape.unlink(missing_ok=True)
    metrics_port = find_free_port()
    job_cmd = [sys.executable, "-m", "arealite.cli.main", "main-job", f"cluster.fileroot={fileroot}",
               "trial_name=observe", f"total_train_steps={args.steps}", "evaluator.freq_steps=10",
               "servers.enable_metrics=true", f"stats_logger.metrics_port={metrics_port}",
               "stats_logger.trace=true"]
    tmp = Path(tempfile.mkdtemp(prefix="observe-"))
    prom_base = f"http://127.0.0.1:{find_free_port()}"
    job_log = open(tmp / "main_job.log", "w")
    job = subprocess.Popen(job_cmd, stdout=job_log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
    prom = None
    failures: list[str] = []
    try:
        wait_for(scrape.is_file, 900, "the launcher's scrape config", job)
        print(f"scrape config {scrape}:\n{scrape.read_text()}")
        prom_cmd = [prom_bin, f"--config.file={scrape.resolve()}", f"--storage.tsdb.path={tmp / 'tsdb'}",
                    f"--web.listen-address={prom_base.split('//')[1]}", "--log.level=warn"]
        prom = subprocess.Popen(prom_cmd, stdout=open(tmp / "prometheus.log", "w"), stderr=subprocess.STDOUT,
                                start_new_session=True)
        wait_for(lambda: _ready(prom_base), 60, "Prometheus ready")
        t_start = time.time()
        seen_up: dict[str, bool] = {}
        while job.poll() is None:
            for t in api(prom_base, "/api/v1/targets")["activeTargets"]:
                key = f"{t['labels']['job']} {t['scrapeUrl']}"
                seen_up[key] = seen_up.get(key, False) or t["health"] == "up"
            time.sleep(2)
        time.sleep(6)  # one more scrape interval of the finished run's last values (targets gone)
        t_end = time.time()
        print(f"main job exit {job.returncode}; its log: {tmp / 'main_job.log'}")
        if job.returncode != 0:
            failures.append(f"main job exited {job.returncode}")
        print("\ntargets (scraped at least once while the run lasted):")
        for key, up in sorted(seen_up.items()):
            print(f"  {'up  ' if up else 'DOWN'} {key}")
            if not up:
                failures.append(f"target never scraped: {key}")
        if not any(k.startswith("trainer") for k in seen_up) or not any(k.startswith("servers") for k in seen_up):
            failures.append(f"missing a job among the targets: {sorted(seen_up)}")
        print(f"\ndashboard queries ({DASHBOARD.relative_to(ROOT)}), over the run's {t_end - t_start:.0f}s:")
        for title, expr in dashboard_queries():
            data = api(prom_base, "/api/v1/query_range", query=expr, start=f"{t_start:.3f}",
                       end=f"{t_end:.3f}", step="5")
            series = data["result"]
            points = sum(len(s["values"]) for s in series)
            print(f"  {'ok  ' if points else 'NONE'} {len(series):2d} series {points:4d} points  {expr}")
            if not points:
                failures.append(f"no data: {title}: {expr}")
        trace = run / "logs" / "trace_rank0.json"
        from arealite.observe.trace_plot import plot_trace

        png = plot_trace(trace, run / "timeline.png")
        print(f"\ntimeline: {png} (trace {trace})")
        if args.png:
            Path(args.png).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(png, args.png)
            print(f"copied to {args.png}")
    finally:
        stop_group(job)
        if prom is not None:
            stop_group(prom)
        job_log.close()
    if failures:
        print("\nobserve: FAILED\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1
    print("\nobserve: every target scraped, every dashboard query returned data")
    return 0


if __name__ == "__main__":
    sys.exit(main())
