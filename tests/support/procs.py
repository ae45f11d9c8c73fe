"""Start processes for tests and always kill them by process group, even on failure."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

from arealite.utils.network import LOOPBACK, find_free_port, wait_http_ok
from benchmarks.harness.grpo_runs import log_tail  # noqa: F401 - shared with the chaos benchmark


def kill_group(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM the process group, then SIGKILL whatever is left after ``grace`` seconds."""
    if proc.poll() is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # stray children of an exited leader
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=grace)


@contextlib.contextmanager
def spawn(cmd: list[str], env: dict | None = None) -> Iterator[tuple[subprocess.Popen, str]]:
    """Run ``cmd`` in its own process group, output to a temp log; yields (proc, log_path)."""
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env, start_new_session=True
    )
    try:
        yield proc, log.name
    finally:
        kill_group(proc)
        log.close()


@contextlib.contextmanager
def embedded_server(
    model_path: str, extra_args: list[str] | None = None, timeout: float = 120.0
) -> Iterator[str]:
    """Start ``python -m servers.launch_server`` on a free loopback port; yields ``host:port``."""
    with embedded_server_proc(model_path, extra_args, timeout) as (addr, _):
        yield addr


@contextlib.contextmanager
def embedded_server_proc(
    model_path: str, extra_args: list[str] | None = None, timeout: float = 120.0
) -> Iterator[tuple[str, subprocess.Popen]]:
    """``embedded_server``, also yielding its process (for tests that kill it)."""
    with embedded_servers(model_path, 1, extra_args, timeout) as (one,):
        yield one


@contextlib.contextmanager
def embedded_servers(
    model_path: str, n: int, extra_args: list[str] | None = None, timeout: float = 120.0
) -> Iterator[list[tuple[str, subprocess.Popen]]]:
    """``n`` embedded servers started at once (their start-ups overlap); yields
    ``[(host:port, process), ...]``."""
    with contextlib.ExitStack() as stack:
        started = []
        for _ in range(n):
            port = find_free_port()
            cmd = [
                sys.executable, "-m", "servers.launch_server", "--model-path", str(model_path),
                "--host", LOOPBACK, "--port", str(port), *(extra_args or []),
            ]
            started.append((port, *stack.enter_context(spawn(cmd))))
        t0 = time.monotonic()
        for port, proc, log in started:
            left = max(1.0, timeout - (time.monotonic() - t0))
            ok = wait_http_ok(f"http://{LOOPBACK}:{port}/health", left,
                              alive=lambda p=proc: p.poll() is None)
            if not ok:
                raise RuntimeError(f"server did not become healthy in "
                                   f"{time.monotonic() - t0:.0f}s:\n{log_tail(log)}")
        yield [(f"{LOOPBACK}:{port}", proc) for port, proc, _ in started]


def run_gloo_peers(script: str, out_dir, n: int = 2, timeout: float = 60.0) -> list:
    """Run ``python script PORT RANK N OUT`` as ``n`` ranks of one gloo group on a free port,
    each in its own process group; asserts each exits 0 within ``timeout`` (else shows its log)
    and returns the ranks' output paths."""
    from pathlib import Path

    port = find_free_port()
    outs = [Path(out_dir) / f"rank{r}.json" for r in range(n)]
    with contextlib.ExitStack() as stack:
        procs = [stack.enter_context(spawn([sys.executable, str(script), str(port), str(r),
                                            str(n), str(outs[r])])) for r in range(n)]
        for p, log in procs:
            try:
                rc = p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                rc = None
            assert rc == 0, log_tail(log)
    return outs


@contextlib.contextmanager
def cpu_hog(n: int = 1) -> Iterator[None]:
    """``n`` busy processes beside a test, as when CI shares its 2 cores with other work."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
             for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            kill_group(p, grace=1.0)


def vllm_available() -> bool:
    """Whether ``make setup-vllm`` has built the vLLM virtualenv the vllm backend runs from."""
    from arealite.backends.vllm.server_command import vllm_python

    py = vllm_python(dict(os.environ))
    return py != sys.executable and os.path.exists(py)


class VLLMServers:
    """``n`` real vLLM servers (``launcher.server_backend=vllm``'s own command line, from
    ``arealite.backends.vllm.server_command``), each in its own process group, started at once."""

    def __init__(self, model_path: str, n: int, max_model_len: int = 512,
                 extra_args: tuple[str, ...] = ()):
        from types import SimpleNamespace

        from arealite.backends.vllm.server_command import vllm_command

        self.ports = [find_free_port() for _ in range(n)]
        self.addrs = [f"{LOOPBACK}:{p}" for p in self.ports]
        sg = SimpleNamespace(dtype="float32", log_level="warning", mem_fraction_static=None,
                             context_length=max_model_len, max_running_requests=None, tp_size=1,
                             enable_return_routed_experts=False, extra_args=list(extra_args))
        self.cmds = [vllm_command(str(model_path), LOOPBACK, p, sg, i, True, None, dict(os.environ))
                     for i, p in enumerate(self.ports)]
        self.procs: list[subprocess.Popen] = []
        self.logs = [tempfile.NamedTemporaryFile("w+", suffix=f".vllm{i}.log", delete=False)
                     for i in range(n)]

    def start(self, timeout: float = 400.0) -> None:
        for (cmd, env), log in zip(self.cmds, self.logs):
            self.procs.append(subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "OMP_NUM_THREADS": "1", **env}))
        for i, (addr, proc) in enumerate(zip(self.addrs, self.procs)):
            if not wait_http_ok(f"http://{addr}/health", timeout, alive=lambda p=proc: p.poll() is None):
                raise RuntimeError(f"vLLM server {i} did not start in {timeout:.0f}s:\n"
                                   f"{log_tail(self.logs[i].name, 40)}")

    def freeze(self, i: int) -> None:
        """SIGSTOP server ``i``'s process group: its socket still takes connections, so a
        request sent to it stays in flight until it is killed."""
        os.killpg(self.procs[i].pid, signal.SIGSTOP)

    def kill(self, i: int) -> None:
        kill_group(self.procs[i], grace=0.1)

    def close(self) -> None:
        for p in self.procs:
            kill_group(p)
        for f in self.logs:
            f.close()
