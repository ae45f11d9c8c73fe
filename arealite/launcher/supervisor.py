"""Child processes of the launcher: own process group, prefixed log streaming, clean stop.

Every child starts in a new session (so a terminal's Ctrl-C reaches only the launcher, which then
stops the children in order). Its stdout+stderr is read by a thread that writes each line to the
console as ``[name] line`` and to ``logs/<name>.log``, and keeps the last lines for error
messages. torchrun starts its workers in sessions of their own, so killing torchrun's group would
miss them: the supervisor remembers every descendant it has seen (refreshed while monitoring)
and stops those too. Stopping is SIGTERM to every group and process, then SIGKILL after a grace
period to whatever is left.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

import psutil

from arealite.launcher.error_lines import TracebackFilter
from arealite.launcher.plan import ProcSpec

TAIL_LINES = 80  # torchrun alone prints ~35 lines of summary after a worker fails


class Console:
    """Thread-safe line writer shared by all children (and the launcher's own messages)."""

    def __init__(self, stream: TextIO | None = None, log_file: Path | None = None) -> None:
        self._stream = stream or sys.stdout
        self._lock = threading.Lock()
        self._file = open(log_file, "a", buffering=1) if log_file else None
        # set while the launcher stops everything: what the children print as they die (their
        # signal tracebacks) goes to their log files only
        self.children_muted = False

    def line(self, prefix: str, text: str, stream: TextIO | None = None) -> None:
        with self._lock:
            if self.children_muted and prefix != "launcher":
                return
            out = stream or self._stream
            try:
                out.write(f"[{prefix}] {text}\n")
                out.flush()
            except (ValueError, OSError):
                pass  # console closed: the log files still have everything
            if self._file is not None and prefix == "launcher":
                self._file.write(f"{time.strftime('%H:%M:%S')} {text}\n")

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def _load_libc():
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
    except OSError:
        return None


# Loaded here, not in the child: between fork and exec only async-signal-safe work is sane
# (no imports, which take locks other threads of the launcher may hold).
_LIBC = _load_libc()
_PR_SET_PDEATHSIG = 1


def _set_pdeathsig() -> None:
    """Linux: the child gets SIGTERM if the launcher dies without cleaning up (e.g. SIGKILL)."""
    _LIBC.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


# ``Popen(preexec_fn=DIE_WITH_PARENT)``: None where prctl is not available (not Linux)
DIE_WITH_PARENT = _set_pdeathsig if _LIBC is not None else None


class ManagedProcess:
    """One started ``ProcSpec``; see the module docstring."""

    def __init__(self, spec: ProcSpec, log_dir: Path, console: Console) -> None:
        self.spec = spec
        self.name = spec.name
        self.log_path = log_dir / f"{spec.name}.log"
        self._console = console
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.errors = TracebackFilter(str(self.log_path))
        self._known: dict[int, psutil.Process] = {}
        self.proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.spec.env}
        self.proc = subprocess.Popen(
            self.spec.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, start_new_session=True,
            preexec_fn=DIE_WITH_PARENT,
        )
        self._reader = threading.Thread(target=self._pump, name=f"log-{self.name}", daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        with open(self.log_path, "a", buffering=1, errors="replace") as f:
            f.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} {self.spec.shell()}\n")
            for raw in iter(self.proc.stdout.readline, b""):
                text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                self._tail.append(text)
                f.write(text + "\n")
                for shown in self.errors.feed(text):  # a traceback: one line, all in the log
                    self._console.line(self.name, shown)
        with contextlib.suppress(OSError):
            self.proc.stdout.close()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def tail(self, n: int = TAIL_LINES) -> list[str]:
        """The last lines of output; after an exit, waits (briefly) until they are all read."""
        if self.poll() is not None and self._reader is not None:
            self._reader.join(timeout=2.0)
        return list(self._tail)[-n:]

    def what_failed(self) -> str:
        """Its last error (or last line) in one line, once all output is read."""
        self.tail(0)
        return self.errors.what_failed()

    def refresh_descendants(self) -> None:
        """Remember descendants now, so they can be stopped even after their parent is gone."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(psutil.Error):
            for p in psutil.Process(self.proc.pid).children(recursive=True):
                self._known.setdefault(p.pid, p)

    def alive_processes(self) -> list[psutil.Process]:
        """The leader (if running) and every remembered descendant still running."""
        self.refresh_descendants()
        out = []
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(psutil.Error):
                out.append(psutil.Process(self.proc.pid))
        out += [p for p in self._known.values() if _running(p)]
        return out

    def stop(self, grace: float) -> None:
        """SIGTERM every process group and remembered process, SIGKILL what is left after
        ``grace`` seconds, then reap the leader and drain its output."""
        if self.proc is None:
            return
        self._signal_all(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and self.alive_processes():
            time.sleep(0.05)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=0)
        if self.alive_processes():
            self._signal_all(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=grace)
        psutil.wait_procs([p for p in self._known.values() if _running(p)], timeout=grace)
        if self._reader is not None:
            self._reader.join(timeout=2.0)

    def _signal_all(self, sig: int) -> None:
        # Only groups of processes known to be ours and alive: a pid (hence a group id) of an
        # exited, reaped child may already belong to someone else's process.
        own = os.getpgrp()
        procs = self.alive_processes()
        groups: set[int] = set()
        for p in procs:
            with contextlib.suppress(psutil.Error, OSError):
                groups.add(os.getpgid(p.pid))
        for g in groups - {own}:  # never signal the launcher's own group
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(g, sig)
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.send_signal(sig)


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def stop_all(procs: list[ManagedProcess], grace: float) -> None:
    """Stop several processes at once (all get SIGTERM before any grace period runs)."""
    threads = [threading.Thread(target=p.stop, args=(grace,), daemon=True) for p in procs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=3 * grace + 5)
