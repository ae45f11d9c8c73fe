"""Run untrusted Python (a model's completion) against test cases, contained.

``run_tests(code, tests, limits)`` starts ``runner.py`` in a separate process group and returns
which tests passed. The defences, each applied where the host allows it and reported in
``SandboxResult.layers`` (``sandbox_layers()`` probes this host once):

- ``pid_ns``: a new pid namespace; the supervisor is its PID 1, so every process a test starts
  (a fork loop, a daemon that called ``setsid``) is killed with it; after each test it kills
  everything else in the namespace.
- ``net_ns``: a new network namespace with no interface up: no connection can be made, not even
  with raw syscalls. Without it only Python's ``socket`` module is blocked (ctypes bypasses it).
- ``mount_ns`` + ``readonly_fs``: every mount is remounted read-only inside the namespace; the
  only writable place is ``private_tmpfs``, a size-capped tmpfs at the temp working directory
  that vanishes with the namespace. Nothing changes on the host.
- ``uid_drop``: when started as root, each test runs as a fresh unprivileged uid (one per run,
  above 2e9) with no capabilities, so ``RLIMIT_NPROC`` really caps its processes (root ignores
  it) and no root-owned file is writable even where a read-only remount failed. Directories the
  interpreter needs but that uid cannot enter (e.g. a 0700 ``/root``) are exposed inside the
  mount namespace only.
- Always: ``RLIMIT_AS`` (memory), ``RLIMIT_CPU``, ``RLIMIT_FSIZE``, ``RLIMIT_NOFILE``, no core
  files, ``no_new_privs``, an empty capability bounding set, a wall-clock limit per test and for
  the whole run (the caller kills the process group), stdout capped, a fresh ``python -I -S``
  per test (stdlib only unless ``allow_site_packages``) that never holds the expected outputs.

Honest limits: on a host without namespaces (no root, no unprivileged user namespaces) the
network block is Python-level only and a non-root run can write wherever its user can. Assert
tests run inside the untrusted process, so code that introspects its own interpreter could forge
an assert pass; stdin/stdout and function-call tests are judged outside it. There is no seccomp
filter and no cgroup: memory is capped per process (address space), processes per uid.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

RUNNER = Path(__file__).with_name("runner.py")


@dataclass(frozen=True)
class SandboxLimits:
    timeout_per_test: float = 2.0  # wall-clock seconds per test (CPU limit is ceil(this) + 1)
    memory_mb: int = 256  # address-space limit of each test process
    max_procs: int = 16  # processes a test may run at once (with a per-run uid)
    max_output_bytes: int = 1 << 20  # stdout beyond this fails the test
    max_file_mb: int = 16  # largest file a test may write
    tmpfs_mb: int = 64  # size of the private working directory (with a mount namespace)
    total_timeout: float | None = None  # whole run; default: tests * (timeout + 1) + 10
    allow_site_packages: bool = False  # let solutions import the caller's site-packages


@dataclass
class TestOutcome:
    passed: bool
    reason: str
    seconds: float = 0.0
    stderr_tail: str = ""
    stdout_tail: str = ""


@dataclass
class SandboxResult:
    outcomes: list[TestOutcome]
    total: int
    layers: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # the run itself failed (timeout of the whole run, crash)

    @property
    def passed(self) -> int:
        return sum(o.passed for o in self.outcomes)

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0


def normalize_tests(tests: Any) -> list[dict[str, Any]]:
    """Accepted test cases, each one of:

    - ``{"input": str, "output": str}``: run the program with that stdin, compare stdout;
    - ``{"fn_name": str, "args": list, "expected": Any}``: call a function (or a method of
      ``Solution``) and compare its JSON-able result;
    - ``"assert f(2) == 4"``: a statement run after the solution (forgeable, see above).
    Also accepts an APPS-style ``{"inputs": [...], "outputs": [...], "fn_name"?: str}`` (or its
    JSON string). Anything else is a ``ValueError``.
    """
    if isinstance(tests, str):
        try:
            tests = json.loads(tests)
        except ValueError:
            raise ValueError("tests is a string but not JSON") from None
    if isinstance(tests, dict) and "inputs" in tests and "outputs" in tests:
        ins, outs, fn = tests["inputs"], tests["outputs"], tests.get("fn_name")
        if len(ins) != len(outs):
            raise ValueError("APPS-style tests: inputs and outputs differ in length")
        if fn:
            tests = [{"fn_name": fn, "args": a, "expected": e} for a, e in zip(ins, outs)]
        else:
            tests = [{"input": i, "output": o} for i, o in zip(ins, outs)]
    if not isinstance(tests, (list, tuple)):
        raise ValueError(f"tests must be a list of test cases, got {type(tests).__name__}")
    out = []
    for i, t in enumerate(tests):
        if isinstance(t, str):
            out.append({"kind": "assert", "payload": {"assert": t}})
        elif isinstance(t, dict) and "input" in t and "output" in t:
            out.append({"kind": "stdio", "input": str(t["input"]), "output": str(t["output"])})
        elif isinstance(t, dict) and "fn_name" in t and "expected" in t:
            args = t.get("args", [])
            if not isinstance(args, (list, tuple)):
                raise ValueError(f"test {i}: args must be a list")
            out.append({"kind": "call", "payload": {"fn_name": str(t["fn_name"]), "args": list(args)},
                        "expected": t["expected"]})
        else:
            raise ValueError(f"test {i} is not a recognised test case: {t!r:.200}")
        if isinstance(t, dict) and "timeout" in t:
            out[-1]["timeout"] = float(t["timeout"])
    return out


def _python_paths(limits: SandboxLimits) -> tuple[str, list[str], list[str]]:
    """The base interpreter (not a venv wrapper), directories it needs, extra sys.path."""
    python = os.path.realpath(sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    extra = []
    if limits.allow_site_packages:
        import site

        extra = [p for p in site.getsitepackages() if os.path.isdir(p)]
    return python, [prefix, *extra], extra


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


_PREFIX = "arealite-sbx-"
_last_sweep = float("-inf")


def _sweep_stale_workdirs() -> None:
    """Remove working directories left by callers that were killed mid-run (a reward worker
    killed on timeout cannot clean up). Names carry the creator's pid; at most once a minute."""
    global _last_sweep
    if time.monotonic() - _last_sweep < 60:
        return
    _last_sweep = time.monotonic()
    root = tempfile.gettempdir()
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        pid = name[len(_PREFIX):].split("-", 1)[0]
        if name.startswith(_PREFIX) and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def run_tests(code: str, tests: Any, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run ``code`` against ``tests`` in the sandbox; never raises for anything the code does."""
    limits = limits or SandboxLimits()
    cases = normalize_tests(tests)
    if not isinstance(code, str):
        raise ValueError("code must be a string")
    python, expose, extra = _python_paths(limits)
    _sweep_stale_workdirs()
    workdir = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-")
    job = {"code": code, "tests": cases, "limits": asdict(limits), "workdir": workdir,
           "python": python, "expose": expose, "extra_paths": extra}
    budget = limits.total_timeout or 10.0 + sum(
        c.get("timeout", limits.timeout_per_test) + 1.0 for c in cases)
    error = None
    proc = subprocess.Popen(
        [python, "-I", "-S", "-B", str(RUNNER)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True, close_fds=True, env={"PATH": os.defpath, "LANG": "C.UTF-8"},
    )
    try:
        out, err = proc.communicate(json.dumps(job).encode(), timeout=budget)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        error = f"sandbox run exceeded {budget:.1f}s"
    finally:
        _kill_group(proc)  # nothing of the run may outlive it
        shutil.rmtree(workdir, ignore_errors=True)
    layers: dict[str, Any] = {}
    outcomes: list[TestOutcome | None] = [None] * len(cases)
    done = False
    for line in out.decode("utf-8", "replace").splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if "layers" in msg:
            layers = msg["layers"]
        elif "test" in msg and 0 <= msg["test"] < len(cases):
            outcomes[msg["test"]] = TestOutcome(
                bool(msg["passed"]), str(msg["reason"]), float(msg.get("seconds", 0.0)),
                str(msg.get("stderr_tail", "")), str(msg.get("stdout_tail", "")))
        done = done or bool(msg.get("done"))
    if not done and error is None:
        error = f"sandbox exited with {proc.returncode}: {err.decode('utf-8', 'replace')[-500:]}"
    final = [o or TestOutcome(False, "not run") for o in outcomes]
    return SandboxResult(final, len(cases), layers, error)


@functools.lru_cache(maxsize=1)
def sandbox_layers() -> dict[str, Any]:
    """Which defences this host gives the sandbox (runs one trivial test, once per process)."""
    t0 = time.monotonic()
    res = run_tests("print(1)", [{"input": "", "output": "1"}])
    return {**res.layers, "probe_ok": res.passed == 1, "probe_seconds": round(time.monotonic() - t0, 3)}


__all__ = ["SandboxLimits", "SandboxResult", "TestOutcome", "normalize_tests", "run_tests",
           "sandbox_layers"]
