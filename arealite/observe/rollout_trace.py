"""What the rollout client adds to the trace (``stats_logger.trace=true``; see
``arealite.observe.trace``): each episode (from its submission, with its wait in the queue for
the staleness gate), each request of it with its generation segments per server and the
pauses between them, each reward call, and each weight push to the servers.

Installed on one ``RemoteSGLangEngine`` only when tracing is on, by wrapping from outside
(``install``): the executor's ``submit`` wraps the workflow, the workflow hands the episode a
wrapped engine whose ``agenerate`` records the request, and the router wrapper records which
server each segment ran on. Nothing of this runs when tracing is off.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from arealite.api import reward_api
from arealite.api.workflow_api import RolloutWorkflow
from arealite.observe import trace

_episode_ids = itertools.count()


@dataclass
class _Request:
    rid: str
    start: float
    segments: list[tuple[str, float, float, bool]] = field(default_factory=list)
    open: tuple[str, float] | None = None


EPISODE: contextvars.ContextVar[int | None] = contextvars.ContextVar("trace_episode", default=None)
REQUEST: contextvars.ContextVar[_Request | None] = contextvars.ContextVar("trace_request", default=None)


class TracedEngine:
    """The engine as an episode sees it: ``agenerate`` recorded, everything else passed on."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def agenerate(self, req: Any) -> Any:
        rec = _Request(req.rid, time.perf_counter())
        token = REQUEST.set(rec)
        outcome = "error"
        try:
            resp = await self._engine.agenerate(req)
            outcome = resp.stop_reason
            return resp
        finally:
            REQUEST.reset(token)
            _emit_request(rec, time.perf_counter(), outcome)


    async def agenerate_group(self, reqs: list[Any]) -> list[Any]:
        # one by one, so that each request is on the timeline with its own segments
        return list(await asyncio.gather(*(self.agenerate(r) for r in reqs)))


def _emit_request(rec: _Request, end: float, outcome: str) -> None:
    tr = trace.TRACER
    if tr is None:
        return
    lane = tr.lane("call", rec.start, end)
    ep = EPISODE.get()
    tr.complete("request", "request", lane, rec.start, end,
                {"rid": rec.rid, "episode": ep, "outcome": outcome, "segments": len(rec.segments)})
    prev: tuple[str, float, float, bool] | None = None
    for i, seg in enumerate(rec.segments):
        addr, t0, t1, ok = seg
        if prev is not None:  # after an answer: a pause cut it; after a failure: a retry
            tr.complete("paused" if prev[3] else "retry wait", "pause", lane, prev[2], t0,
                        {"episode": ep, "rid": rec.rid})
        tr.complete(f"generate @ {addr}", "generate", lane, t0, t1,
                    {"server": addr, "ok": ok, "segment": i, "resumed": i > 0, "episode": ep,
                     "rid": rec.rid})
        prev = seg


class TracedPool:
    """The client's router, recording each attempt's server and time for the current request."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)

    def choose(self, rid: str, tried: Any = frozenset(), acquire: bool = False) -> str:
        addr = self._pool.choose(rid, tried, acquire)
        rec = REQUEST.get()
        if rec is not None:
            rec.open = (addr, time.perf_counter())
        return addr

    def release(self, addr: str, success: bool = False) -> None:
        self._pool.release(addr, success)
        rec = REQUEST.get()
        if rec is not None and rec.open is not None:
            rec.segments.append((rec.open[0], rec.open[1], time.perf_counter(), bool(success)))
            rec.open = None


class TracedWorkflow(RolloutWorkflow):
    """One submitted episode: its queue wait and run, with the requests it makes."""

    def __init__(self, inner: RolloutWorkflow, submitted: float) -> None:
        self.inner = inner
        self.submitted = submitted

    async def arun_episode(self, engine: Any, data: dict[str, Any]) -> Any:
        start = time.perf_counter()
        ep = next(_episode_ids)
        token = EPISODE.set(ep)
        outcome = "failed"
        try:
            traj = await self.inner.arun_episode(TracedEngine(engine), data)
            outcome = "rejected" if traj is None else "accepted"
            return traj
        finally:
            EPISODE.reset(token)
            tr = trace.TRACER
            if tr is not None:
                end = time.perf_counter()
                lane = tr.lane("episode", self.submitted, end)
                tr.complete("episode", "episode", lane, self.submitted, end,
                            {"id": ep, "outcome": outcome, "version_at_end": engine.get_version()})
                tr.complete("queued", "queue", lane, self.submitted, start, {"episode": ep})


def _reward_call(name: str, start: float, end: float, ok: bool) -> None:
    tr, ep = trace.TRACER, EPISODE.get()
    if tr is not None and ep is not None:  # a traced episode's (not an evaluation's)
        tr.complete(f"reward {name}", "reward", tr.lane("call", start, end), start, end,
                    {"episode": ep, "ok": ok})


def install(rollout: Any) -> None:
    """Trace ``rollout``'s episodes, requests, reward calls and weight pushes (after
    ``initialize``; ``trace.start`` first)."""
    executor = rollout.executor
    submit = executor.submit

    def traced_submit(data: Any, workflow: RolloutWorkflow, *args: Any, **kwargs: Any) -> None:
        if not isinstance(workflow, TracedWorkflow):
            workflow = TracedWorkflow(workflow, time.perf_counter())
        submit(data, workflow, *args, **kwargs)

    executor.submit = traced_submit
    rollout.pool = TracedPool(rollout.pool)
    reward_api.set_reward_call_observer(_reward_call)
    update = rollout.update_weights

    def traced_update(meta: Any) -> Any:
        t0 = time.perf_counter()
        fut = update(meta)

        def done(f: Any) -> None:
            tr = trace.TRACER
            if tr is not None:
                report = getattr(rollout, "last_weight_update", None)
                tr.complete(f"weight push v{meta.version}", "weight_push", trace.WEIGHT_PUSH_TID, t0,
                            time.perf_counter(), {"version": meta.version, "type": str(meta.type),
                                                  "ok": not f.cancelled() and f.exception() is None,
                                                  "servers": list(getattr(report, "updated", []) or [])})

        fut.add_done_callback(done)
        return fut

    rollout.update_weights = traced_update
