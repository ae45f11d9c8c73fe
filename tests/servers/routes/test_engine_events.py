"""``engine_events``, the event stream both streaming routes (``/generate``, ``/v1/...``) read: a
caller that leaves after the first event frees the reader lock (a weight update waits for it) and
aborts the other sequences at once, not when the generator is collected. On the real engine."""

from __future__ import annotations

import asyncio
import time
from contextlib import aclosing

from servers.engine.sequence import Sequence
from servers.protocol.request import SamplingParams
from servers.routes.generate import engine_events
from servers.state import ServerState
from tests.servers.engine.test_server_engine import engine, runner  # noqa: F401


def test_leaving_the_stream_early_frees_the_lock_and_aborts_the_rest(engine, runner):  # noqa: F811
    # the first sequence ends after one token (the event the caller leaves on); the others would
    # take 400 steps of at least 50 ms (a step is slowed so that the tiny model cannot run them to
    # the end before the loop delivers that first event)
    seqs = [Sequence(rid=f"e{i}", prompt=[5, 6, 7 + i],
                     params=SamplingParams(max_new_tokens=1 if i == 0 else 400, ignore_eos=True))
            for i in range(3)]
    forward = runner.forward

    def slow(*args, **kw):
        time.sleep(0.05)
        return forward(*args, **kw)

    async def leave_after_one_event() -> tuple[int, int]:
        state = ServerState(args=None, runner=runner, engine=engine, detok=None)
        readers_inside = -1
        async with aclosing(engine_events(state, seqs)) as events:
            async for _ in events:
                readers_inside = state.lock.readers
                break  # as a route does on an error chunk
        return readers_inside, state.lock.readers

    runner.forward = slow
    try:
        inside, after = asyncio.run(leave_after_one_event())
        deadline = time.monotonic() + 10
        while not all(s.finished for s in seqs) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        runner.forward = forward
    assert (inside, after) == (1, 0)
    assert all(s.finished for s in seqs)
    assert seqs[0].finish["type"] == "length"
    # cut short by the abort, not run to their 400 tokens
    assert all(s.finish["type"] == "abort" and len(s.output_ids) < 400 for s in seqs[1:]), [
        (s.finish, len(s.output_ids)) for s in seqs]
