"""The reading-path study's tracer: run lines apart from import lines, and a window that follows
the tasks it schedules on another thread's event loop but not the tasks beside them."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import threading
from pathlib import Path

from benchmarks.harness.line_trace import LineTrace

MODULE = """\
import asyncio

TABLE = {}


def register(name):
    TABLE[name] = len(TABLE)
    return name


register("at import")


def helper():
    return 1


async def inside(started, done):
    started.set()
    await done.wait()
    return helper()


async def outside(started, done):
    await started.wait()
    done.set()  # on the loop thread while push waits
    return 2


def push(loop, started, done):
    return asyncio.run_coroutine_threadsafe(inside(started, done), loop).result(10)
"""


def lines_of(src: str, text: str) -> int:
    return next(i for i, line in enumerate(src.splitlines(), 1) if text in line)


def test_window_follows_its_tasks_and_imports_are_apart(tmp_path: Path):
    pkg = tmp_path / "traced"
    pkg.mkdir()
    (pkg / "mod.py").write_text(MODULE)
    trace = LineTrace([str(pkg)], ["traced/mod.py:push"], str(tmp_path), ["traced/mod.py:inside"])
    loop = asyncio.new_event_loop()
    trace.start()
    try:
        spec = importlib.util.spec_from_file_location("traced_mod", pkg / "mod.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["traced_mod"] = mod
        spec.loader.exec_module(mod)
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        started, done = asyncio.Event(), asyncio.Event()
        beside = asyncio.run_coroutine_threadsafe(mod.outside(started, done), loop)  # not in it
        assert mod.push(loop, started, done) == 1
        assert beside.result(10) == 2
        mod.register("at run time")
    finally:
        trace.stop()
        loop.call_soon_threadsafe(loop.stop)
        sys.modules.pop("traced_mod", None)
    snap = trace.snapshot()
    path = "traced/mod.py"
    at = {
        k: lines_of(MODULE, k)
        for k in (
            "return helper()",
            "done.set()",
            "return 1",
            "TABLE[name]",
            "TABLE = {}",
            "run_coroutine",
        )
    }
    # the module body and what it called ran "at import"; register ran again at run time
    assert (
        at["TABLE = {}"] in snap["imported"][path] and at["TABLE[name]"] in snap["imported"][path]
    )
    assert at["TABLE = {}"] not in snap["run"][path]
    assert {at["return helper()"], at["done.set()"], at["return 1"], at["TABLE[name]"]} <= set(
        snap["run"][path]
    )
    # the window: push, the task it scheduled on the loop thread, and what that task called;
    # not the coroutine that shared the loop, nor register called after the window closed
    window = set(snap["window"][path])
    assert {at["run_coroutine"], at["return helper()"], at["return 1"]} <= window
    assert at["done.set()"] not in window and at["TABLE[name]"] not in window
    # after the mark (inside's first call), in any thread: register's second call too
    after = set(snap["after_mark"][path])
    assert {at["return helper()"], at["return 1"], at["done.set()"], at["TABLE[name]"]} <= after
    assert at["run_coroutine"] not in after  # push's line ran before inside was first called
    assert {f.split(":")[0] for f in snap["functions"][path]} >= {
        "push",
        "inside",
        "outside",
        "helper",
        "register",
    }
