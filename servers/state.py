"""Server-wide state shared by the HTTP routes: engine, pause gate and the model-update lock.

SGLang's tokenizer manager semantics, reproduced on the event loop:
- while paused, new ``/generate`` calls (and generation health probes) wait before starting,
  they are not rejected;
- each ``/generate`` call holds the reader side of the model-update lock for its lifetime;
  a weight update that arrives while *not* paused takes the writer side, so it waits for
  running calls to drain (new calls wait behind it); while paused it applies at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from servers.engine.engine import Engine
from servers.engine.model_runner import ModelRunner
from servers.protocol.responses import Detokenizer
from servers.server_args import ServerArgs
from servers.weights.shared_sources import SharedSources

logger = logging.getLogger(__name__)


class ModelUpdateLock:
    """An asyncio reader/writer lock that prefers writers."""

    def __init__(self) -> None:
        self.readers = 0
        self.writer = False
        self.writers_waiting = 0
        self._cond = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def reader(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self.writer and self.writers_waiting == 0)
            self.readers += 1
        try:
            yield
        finally:
            async with self._cond:
                self.readers -= 1
                self._cond.notify_all()

    @contextlib.asynccontextmanager
    async def writer_lock(self) -> AsyncIterator[None]:
        async with self._cond:
            self.writers_waiting += 1
            try:
                await self._cond.wait_for(lambda: not self.writer and self.readers == 0)
            finally:
                self.writers_waiting -= 1
            self.writer = True
        try:
            yield
        finally:
            async with self._cond:
                self.writer = False
                self._cond.notify_all()


@dataclass
class ServerState:
    args: ServerArgs
    runner: ModelRunner
    engine: Engine
    detok: Detokenizer
    model_path: str = ""
    startup_time: float = field(default_factory=time.time)
    is_pause: bool = False
    shutting_down: bool = False
    weight_session: str | None = None  # selector of the open begin/end session
    groups: dict[str, Any] = field(default_factory=dict)  # group_name -> process group
    recv_buffers: dict[str, Any] = field(default_factory=dict)  # group_name -> BucketBuffer
    # /update_weights_from_tensor buckets of an update in progress (servers/weights/tensor_update.py)
    staged_tensors: list[Any] = field(default_factory=list)
    # a same-host sender's long-lived shared-memory blocks, kept mapped between pushes
    shared_sources: SharedSources = field(default_factory=SharedSources)
    lock: ModelUpdateLock = field(default_factory=ModelUpdateLock)
    pause_cond: asyncio.Condition = field(default_factory=asyncio.Condition)
    grammar_backend: Any = None  # servers.engine.grammar's compiler, built on first use

    def drop_staged(self) -> int:
        """Forget the staged buckets of an unfinished tensor update; returns how many tensors."""
        n = len(self.staged_tensors)
        if n:
            logger.warning("dropping %d staged tensors of an update whose last bucket (the call "
                           "with weight_version) never came: the old weights keep serving", n)
        self.staged_tensors = []
        self.shared_sources.update_dropped()
        return n

    async def wait_unpaused(self) -> None:
        async with self.pause_cond:
            await self.pause_cond.wait_for(lambda: not self.is_pause)

    async def set_paused(self, paused: bool) -> None:
        async with self.pause_cond:
            self.is_pause = paused
            self.pause_cond.notify_all()

    @contextlib.asynccontextmanager
    async def update_guard(self) -> AsyncIterator[None]:
        """Writer lock unless paused (SGLang: a paused server applies updates at once)."""
        if self.is_pause:
            yield
        else:
            async with self.lock.writer_lock():
                yield

    async def in_engine(self, fn) -> Any:
        """Run ``fn`` in the engine thread and await its result."""
        return await asyncio.wrap_future(self.engine.call(fn))
