"""A benchmark's server goes with the benchmark, also when the benchmark is killed before its
``with Server(...)`` block can stop it (SIGKILL, or a SIGTERM with Python's default handler)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from benchmarks.harness.paths import ROOT

pytestmark = pytest.mark.integration

# a gateway over no servers needs no model: the cheapest server of this repository to start (it
# never reports healthy without a worker, so the benchmark holds it without entering the block)
BENCHMARK = """
import time
from benchmarks.harness.server_process import Server
s = Server(None, module="servers.gateway")
print(s.proc.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_server_stops_when_its_benchmark_is_killed(sig: int) -> None:
    bench = subprocess.Popen([sys.executable, "-c", BENCHMARK], stdout=subprocess.PIPE, text=True,
                             cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)
    server_pid = None
    try:
        line = bench.stdout.readline()
        assert line.strip().isdigit(), f"the benchmark did not start its server: {line!r}"
        server_pid = int(line)
        assert psutil.pid_exists(server_pid)
        bench.send_signal(sig)
        bench.wait(timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if psutil.Process(server_pid).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.1)
        else:
            pytest.fail(f"the server (pid {server_pid}) outlived its benchmark killed by {signal.Signals(sig).name}")
    finally:
        for pid in (bench.pid, server_pid):
            if pid is not None:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        bench.wait(timeout=30)
