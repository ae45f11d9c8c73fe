"""A Chrome/Perfetto trace of the run (``stats_logger.trace=true``): JSON trace events
(https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU), one file
per trainer rank, ``logs/trace_rank{r}.json``; open it in https://ui.perfetto.dev or
chrome://tracing.

Every span is a complete event (``"ph": "X"``) written when it ends, with its start and length
in microseconds since the trace began (``time.perf_counter``). Spans that overlap (episodes,
requests, reward calls) are spread over lanes (``tid``): a span goes on the first lane of its
kind whose last span ended before it started, so spans on one lane never overlap and children
(a request's segments, an episode's queue wait) sit on their parent's lane, inside it.

Off (``TRACER is None``) it costs one ``is None`` check where a hook sits.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

# fixed lanes; lanes of overlapping kinds start at these bases
TRAINER_TID = 1
WEIGHT_PUSH_TID = 2
LANE_BASES = {"episode": 100, "call": 1000}
LANE_NAMES = {"episode": "episodes", "call": "requests and reward calls"}

TRACER: TraceWriter | None = None


class TraceWriter:
    def __init__(self, path: str | os.PathLike, rank: int = 0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.pid = rank
        self.t0 = time.perf_counter()
        self._lock = threading.Lock()
        self._events: list[dict[str, Any]] = []
        self._lanes: dict[str, list[float]] = {k: [] for k in LANE_BASES}  # last end per lane
        self._file = open(self.path, "w")
        self._file.write("[")
        self._first = True
        self._meta("process_name", 0, {"name": f"trainer rank {rank}"})
        self._meta("thread_name", TRAINER_TID, {"name": "trainer: steps and phases"})
        self._meta("thread_name", WEIGHT_PUSH_TID, {"name": "weight push (servers)"})

    def _meta(self, name: str, tid: int, args: dict[str, Any]) -> None:
        self._events.append({"ph": "M", "name": name, "pid": self.pid, "tid": tid, "args": args})

    def us(self, t: float) -> float:
        return round((t - self.t0) * 1e6, 1)

    def complete(self, name: str, cat: str, tid: int, start: float, end: float,
                 args: dict[str, Any] | None = None) -> None:
        """A span from ``start`` to ``end`` (``time.perf_counter`` seconds) on lane ``tid``."""
        ev = {"ph": "X", "name": name, "cat": cat, "pid": self.pid, "tid": tid,
              "ts": self.us(start), "dur": round(max(0.0, end - start) * 1e6, 1)}
        if args:
            ev["args"] = args
        with self._lock:
            self._events.append(ev)

    def lane(self, kind: str, start: float, end: float) -> int:
        """The first lane of ``kind`` free over [start, end] (spans of a kind end in order)."""
        with self._lock:
            ends = self._lanes[kind]
            for i, last in enumerate(ends):
                if last <= start:
                    ends[i] = end
                    return LANE_BASES[kind] + i
            ends.append(end)
            i = len(ends) - 1
            self._meta("thread_name", LANE_BASES[kind] + i, {"name": f"{LANE_NAMES[kind]} {i}"})
            return LANE_BASES[kind] + i

    def flush(self) -> None:
        with self._lock:
            events, self._events = self._events, []
            if self._file is None:
                return
            for ev in events:
                self._file.write(("\n" if self._first else ",\n") + json.dumps(ev))
                self._first = False
            self._file.flush()

    def close(self) -> None:
        self.flush()
        with self._lock:
            if self._file is not None:
                self._file.write("\n]\n")
                self._file.close()
                self._file = None


def start(path: str | os.PathLike, rank: int = 0) -> TraceWriter:
    """Turn tracing on for this process (hooks read ``TRACER``)."""
    global TRACER
    TRACER = TraceWriter(path, rank)
    return TRACER


def stop() -> None:
    global TRACER
    if TRACER is not None:
        TRACER.close()
        TRACER = None


def load_trace(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The events of a trace file, also one cut short by a crash (no closing bracket)."""
    text = Path(path).read_text().rstrip()
    if not text.endswith("]"):
        text = text.rstrip(",") + "\n]"
    data = json.loads(text)
    return data["traceEvents"] if isinstance(data, dict) else data
