"""What the rollout client adds to the trace (``stats_logger.trace=true``; see
``arealite.observe.trace``): each episode (from its submission, with its wait in the queue for
the staleness gate), each request with its generation segments per server and the pauses
between them, each reward call, and each weight push to the servers.

``RolloutTrace`` is a ``RolloutObserver``: the client and the executor call its hooks where the
events happen, once ``StepObservers`` attached it (only when tracing is on; off, nothing of
this runs). An episode's id lives in a context variable set in the episode's task, so its
requests and reward calls carry it.
"""

from __future__ import annotations

import contextvars
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from arealite.observe import trace
from arealite.observe.rollout_observer import RolloutObserver

_episode_ids = itertools.count()


@dataclass
class _Request:
    rid: str
    start: float
    segments: list[tuple[str, float, float, bool]] = field(default_factory=list)


@dataclass
class _Episode:
    id: int
    submitted: float
    start: float
    token: contextvars.Token


EPISODE: contextvars.ContextVar[int | None] = contextvars.ContextVar("trace_episode", default=None)


class RolloutTrace(RolloutObserver):
    def on_episode_submitted(self) -> float:
        return time.perf_counter()

    def on_episode_start(self, submitted: float | None) -> _Episode | None:
        if submitted is None:  # queued before the trace was attached
            return None
        start = time.perf_counter()
        ep = next(_episode_ids)
        return _Episode(ep, submitted, start, EPISODE.set(ep))

    def on_episode_end(self, episode: _Episode | None, outcome: str, version: int) -> None:
        if episode is None:
            return
        EPISODE.reset(episode.token)
        tr = trace.TRACER
        if tr is not None:
            end = time.perf_counter()
            lane = tr.lane("episode", episode.submitted, end)
            tr.complete("episode", "episode", lane, episode.submitted, end,
                        {"id": episode.id, "outcome": outcome, "version_at_end": version})
            tr.complete("queued", "queue", lane, episode.submitted, episode.start,
                        {"episode": episode.id})

    def on_request_start(self, rid: str) -> _Request:
        return _Request(rid, time.perf_counter())

    def on_request_attempt(self, request: _Request, addr: str, start: float, ok: bool) -> None:
        request.segments.append((addr, start, time.perf_counter(), ok))

    def on_request_end(self, request: _Request, outcome: str) -> None:
        tr = trace.TRACER
        if tr is None:
            return
        end = time.perf_counter()
        lane = tr.lane("call", request.start, end)
        ep = EPISODE.get()
        tr.complete("request", "request", lane, request.start, end,
                    {"rid": request.rid, "episode": ep, "outcome": outcome,
                     "segments": len(request.segments)})
        prev: tuple[str, float, float, bool] | None = None
        for i, seg in enumerate(request.segments):
            addr, t0, t1, ok = seg
            if prev is not None:  # after an answer: a pause cut it; after a failure: a retry
                tr.complete("paused" if prev[3] else "retry wait", "pause", lane, prev[2], t0,
                            {"episode": ep, "rid": request.rid})
            tr.complete(f"generate @ {addr}", "generate", lane, t0, t1,
                        {"server": addr, "ok": ok, "segment": i, "resumed": i > 0, "episode": ep,
                         "rid": request.rid})
            prev = seg

    def on_weight_update(self, meta: Any, start: float, end: float, ok: bool,
                         report: Any) -> None:
        tr = trace.TRACER
        if tr is not None:
            tr.complete(f"weight push v{meta.version}", "weight_push", trace.WEIGHT_PUSH_TID, start,
                        end, {"version": meta.version, "type": str(meta.type), "ok": ok,
                              "servers": list(getattr(report, "updated", []) or [])})

    def on_reward_call(self, name: str, start: float, end: float, ok: bool) -> None:
        tr, ep = trace.TRACER, EPISODE.get()
        if tr is not None and ep is not None:  # a traced episode's (not an evaluation's)
            tr.complete(f"reward {name}", "reward", tr.lane("call", start, end), start, end,
                        {"episode": ep, "ok": ok})
