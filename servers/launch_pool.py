"""``python -m servers.launch_pool --n N --model-path DIR [--backend embedded|sglang] [flags...]``.

Starts N inference servers on free loopback ports, waits until each answers ``/health``, prints
their addresses as ``AREAL_LLM_SERVER_ADDRS=host:port,...`` (one line on stdout), and stops them
all on exit, Ctrl-C or SIGTERM, or as soon as one of them dies. ``--backend sglang`` starts real
``python -m sglang.launch_server`` processes with the same flags (on GPU hosts). Flags this
launcher does not know are passed on to every server unchanged. A server that fails to start is
reported with the last lines of its log.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from servers.net import LOOPBACK, find_free_ports, http_ok

MODULES = {"embedded": "servers.launch_server", "sglang": "sglang.launch_server"}


def log_tail(path: str | Path, n: int = 30) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError as e:
        return f"<no log: {e}>"


@dataclass
class ServerProc:
    addr: str
    proc: subprocess.Popen
    log_path: str


@dataclass
class ServerPool:
    """N server processes, each in its own process group (so stopping one stops its children)."""

    n: int
    model_path: str
    backend: str = "embedded"
    host: str = LOOPBACK
    extra_args: list[str] = field(default_factory=list)
    log_dir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    servers: list[ServerProc] = field(default_factory=list)

    def start(self, timeout: float = 300.0) -> list[str]:
        if self.n < 1:
            raise ValueError("--n must be >= 1")
        if self.backend not in MODULES:
            raise ValueError(f"--backend must be one of {sorted(MODULES)}")
        log_dir = Path(self.log_dir or tempfile.mkdtemp(prefix="arealite_pool_"))
        log_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
               "AREALITE_EXIT_WITH_PARENT": "1", **self.env}
        for i, port in enumerate(find_free_ports(self.n, self.host)):
            log_path = str(log_dir / f"server_{i}_{port}.log")
            cmd = [sys.executable, "-m", MODULES[self.backend], "--model-path", self.model_path,
                   "--host", self.host, "--port", str(port), *self.extra_args]
            with open(log_path, "w") as log:
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True)
            self.servers.append(ServerProc(f"{self.host}:{port}", proc, log_path))
        try:
            self._wait_all(timeout)
        except BaseException:
            self.stop()
            raise
        return self.addresses()

    def _wait_all(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pending = list(self.servers)
        while pending:
            for s in list(pending):
                if s.proc.poll() is not None:
                    raise RuntimeError(
                        f"server {s.addr} exited with code {s.proc.returncode} during start-up; "
                        f"last log lines ({s.log_path}):\n{log_tail(s.log_path)}"
                    )
                if http_ok(f"http://{s.addr}/health", timeout=2.0):
                    pending.remove(s)
            if pending and time.monotonic() > deadline:
                s = pending[0]
                raise RuntimeError(
                    f"server {s.addr} not healthy after {timeout:.0f}s; last log lines "
                    f"({s.log_path}):\n{log_tail(s.log_path)}"
                )
            time.sleep(0.2)

    def addresses(self) -> list[str]:
        return [s.addr for s in self.servers]

    def dead(self) -> list[ServerProc]:
        return [s for s in self.servers if s.proc.poll() is not None]

    def stop(self, grace: float = 10.0) -> None:
        for s in self.servers:
            if s.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(s.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for s in self.servers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                s.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(s.proc.pid, signal.SIGKILL)  # the leader or any stray child
            with contextlib.suppress(subprocess.TimeoutExpired):
                s.proc.wait(timeout=grace)

    def __enter__(self) -> ServerPool:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m servers.launch_pool", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, required=True, help="number of servers")
    p.add_argument("--model-path", required=True)
    p.add_argument("--backend", choices=sorted(MODULES), default="embedded")
    p.add_argument("--host", default=LOOPBACK)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for health")
    p.add_argument("--log-dir", default=None)
    args, extra = p.parse_known_args(argv)
    pool = ServerPool(n=args.n, model_path=args.model_path, backend=args.backend, host=args.host,
                      extra_args=extra, log_dir=args.log_dir)
    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        try:
            addrs = pool.start(timeout=args.timeout)
        except (RuntimeError, ValueError) as e:
            print(f"launch_pool: {e}", file=sys.stderr, flush=True)
            return 1
        print(f"AREAL_LLM_SERVER_ADDRS={','.join(addrs)}", flush=True)
        return _supervise(pool, stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _supervise(pool: ServerPool, stop: threading.Event) -> int:
    """Block until a signal or a dead server; always stop the pool."""
    try:
        while not stop.wait(0.5):
            dead = pool.dead()
            if dead:
                s = dead[0]
                print(f"launch_pool: server {s.addr} exited with code {s.proc.returncode}; "
                      f"stopping the pool. Last log lines:\n{log_tail(s.log_path)}",
                      file=sys.stderr, flush=True)
                return 1
        return 0
    finally:
        pool.stop()


if __name__ == "__main__":
    sys.exit(main())
