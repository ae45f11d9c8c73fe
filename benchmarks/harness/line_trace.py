"""Which lines of the repository's own code ran, per process: the runtime half of the reading-path
study (``benchmarks/studies/reading_path.py``).

A ``LineTrace`` records, for every file under its roots, the lines executed at run time, split from
those executed while a module was being imported (module and class bodies, and any function a
module body calls): importing a module is not reading it, so a module counts as on a path only
when one of its functions ran outside an import. It also records the lines that ran inside a
*window*: while one of the entry functions (``path:function``) was on the stack of the thread, or
in a task or callback that the window scheduled (a ``ContextVar`` that asyncio's tasks and
``call_soon_threadsafe`` copy), so a weight push's client half on the rollout client's event loop is
counted while the rollouts that share that loop are not. And, apart, the lines that ran after a
*mark* function was first called (in any thread): e.g. the first phase of the first step, so
what only the set-up runs can be told from what every step runs.

Every Python process of a run loads it through a generated ``sitecustomize`` (``install_from_env``:
the roots, entries and output folder in ``LINE_TRACE_*``) and writes ``<pid>.json`` into the output
folder every second and at exit (the launcher stops the servers with SIGTERM).
"""

from __future__ import annotations

import atexit
import contextvars
import inspect
import json
import os
import sys
import threading
import time
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

ENV_DIR = "LINE_TRACE_DIR"  # where each process writes <pid>.json
ENV_ROOTS = "LINE_TRACE_ROOTS"  # os.pathsep-separated folders whose files are traced
ENV_ENTRIES = "LINE_TRACE_ENTRIES"  # comma-separated "relative/path.py:function" window entries
ENV_BASE = "LINE_TRACE_BASE"  # paths in the output are relative to this folder
ENV_MARKS = "LINE_TRACE_MARKS"  # comma-separated "relative/path.py:function" marks

_IN_WINDOW: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "line_trace_window", default=False
)


def _at_import(frame: FrameType | None) -> bool:
    """A frame runs on behalf of an import: importlib's machinery is below it. (Not "a module
    body other than ``__main__``": code that runs scripts by ``exec``, as pytest-xdist's workers
    do under execnet, puts such a body below everything at run time.)"""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


class LineTrace:
    """``sys.settrace`` over every thread, recording only files under ``roots``."""

    def __init__(
        self, roots: list[str], entries: list[str], base: str, marks: list[str] | None = None
    ) -> None:
        self.roots = tuple(str(Path(r).resolve()) + os.sep for r in roots)
        self.base = str(Path(base).resolve()) + os.sep
        self.entries = {tuple(e.rsplit(":", 1)) for e in entries}
        self.marks = {tuple(e.rsplit(":", 1)) for e in marks or []}
        self.marked = False  # a mark function has been called
        self.run: dict[str, set[int]] = {}  # file -> lines run outside imports
        self.imported: dict[str, set[int]] = {}  # file -> lines run by imports
        self.window: dict[str, set[int]] = {}  # file -> lines run (outside imports) in a window
        self.after: dict[str, set[int]] = {}  # file -> lines run (outside imports) after a mark
        self.functions: dict[str, set[str]] = {}  # file -> "name:first line" run outside imports
        self._codes: dict[CodeType, tuple[str, bool, bool] | None] = {}  # (file, entry, mark)
        self._run_codes: set[CodeType] = set()  # codes seen running outside an import
        self._tokens: dict[int, contextvars.Token] = {}  # id(frame) -> its window token

    # -- tracing -------------------------------------------------------------------------
    def _info(self, code: CodeType) -> tuple[str, bool, bool] | None:
        info = self._codes.get(code, False)
        if info is False:
            path = code.co_filename
            info = None
            if path.startswith(self.roots):
                rel = path[len(self.base) :] if path.startswith(self.base) else path
                key = (rel, code.co_name)
                info = (rel, key in self.entries, key in self.marks)
            self._codes[code] = info
        return info

    def _call(self, frame: FrameType, event: str, arg: Any) -> Any:
        code = frame.f_code
        info = self._info(code)
        if info is None:
            return None
        rel, entry, mark = info
        if code not in self._run_codes:
            if (code.co_flags & inspect.CO_OPTIMIZED) and not _at_import(frame.f_back):
                self._run_codes.add(code)
            else:
                lines = self.imported.setdefault(rel, set())

                def at_import(f: FrameType, ev: str, a: Any) -> Any:
                    if ev == "line":
                        lines.add(f.f_lineno)
                    return at_import

                return at_import
        self.functions.setdefault(rel, set()).add(f"{code.co_name}:{code.co_firstlineno}")
        if entry:
            self._tokens[id(frame)] = _IN_WINDOW.set(True)
        if mark:
            self.marked = True
        lines, window = self.run.setdefault(rel, set()), self.window.setdefault(rel, set())
        after = self.after.setdefault(rel, set())
        tokens = self._tokens

        def at_run(f: FrameType, ev: str, a: Any) -> Any:
            if ev == "line":
                lines.add(f.f_lineno)
                if _IN_WINDOW.get():
                    window.add(f.f_lineno)
                if self.marked:
                    after.add(f.f_lineno)
            elif ev == "return" and entry:  # a coroutine entry also "returns" at each await
                token = tokens.pop(id(f), None)
                if token is not None:
                    _IN_WINDOW.reset(token)
            return at_run

        return at_run

    def start(self) -> None:
        threading.settrace(self._call)
        sys.settrace(self._call)

    def stop(self) -> None:
        sys.settrace(None)
        threading.settrace(None)  # type: ignore[arg-type]

    # -- output --------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """What ran so far, as JSON-ready lists (other threads keep adding: copy, retry)."""

        def lists(d: dict[str, set]) -> dict[str, list]:
            for _ in range(20):
                try:
                    return {k: sorted(v) for k, v in list(d.items()) if v}
                except RuntimeError:  # a set grew while being copied
                    time.sleep(0.001)
            return {}

        return {
            "pid": os.getpid(),
            "argv": list(getattr(sys, "orig_argv", sys.argv)),
            "run": lists(self.run),
            "imported": lists(self.imported),
            "window": lists(self.window),
            "after_mark": lists(self.after),
            "functions": lists(self.functions),
        }

    def write(self, folder: str) -> None:
        path = Path(folder) / f"{os.getpid()}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.snapshot()))
        os.replace(tmp, path)


def install_from_env() -> LineTrace | None:
    """Start tracing this process when ``LINE_TRACE_DIR`` is set (from a ``sitecustomize``)."""
    folder = os.environ.get(ENV_DIR)
    if not folder:
        return None
    roots = [r for r in os.environ.get(ENV_ROOTS, "").split(os.pathsep) if r]
    entries = [e for e in os.environ.get(ENV_ENTRIES, "").split(",") if e]
    marks = [e for e in os.environ.get(ENV_MARKS, "").split(",") if e]
    trace = LineTrace(roots, entries, os.environ.get(ENV_BASE, os.getcwd()), marks)

    def flush_every_second() -> None:
        while True:
            time.sleep(1.0)
            try:
                trace.write(folder)
            except OSError:
                pass  # the folder is gone: the study is over

    threading.Thread(target=flush_every_second, name="line-trace-flush", daemon=True).start()
    atexit.register(trace.write, folder)
    trace.start()
    return trace


SITECUSTOMIZE = "from benchmarks.harness.line_trace import install_from_env\n\ninstall_from_env()\n"


def trace_env(
    site_dir: Path,
    out_dir: Path,
    roots: list[Path],
    entries: list[str],
    base: Path,
    marks: list[str] | None = None,
) -> dict[str, str]:
    """Environment variables that make every Python process started with them trace itself:
    ``site_dir`` gets the ``sitecustomize`` and goes first on ``PYTHONPATH`` (then ``base``)."""
    site_dir.mkdir(parents=True, exist_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    (site_dir / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = os.pathsep.join([str(site_dir), str(base), os.environ.get("PYTHONPATH", "")])
    return {
        "PYTHONPATH": path.rstrip(os.pathsep),
        ENV_DIR: str(out_dir),
        ENV_ROOTS: os.pathsep.join(str(r) for r in roots),
        ENV_ENTRIES: ",".join(entries),
        ENV_BASE: str(base),
        ENV_MARKS: ",".join(marks or []),
    }
