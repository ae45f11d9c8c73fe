"""Tinker's futures, server side: every training and sampling call answers at once with a
request id; the SDK then long-polls ``/api/v1/retrieve_future`` until the result is there.

A pending request answers ``{"type": "try_again", ...}`` after ``wait`` seconds; a finished
one its JSON result, or protobuf bytes for the two types the SDK reads as protobuf; a failed
one the SDK's ``RequestFailedResponse`` (``{"error", "category"}``: ``user`` for a bad request,
``server`` for the rest), which the SDK raises as ``RequestFailedError``. Results are kept
until read and for a while after (a retried read gets the same answer).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger("arealite.tinker.futures")


class UserError(ValueError):
    """The request itself is wrong: reported with category ``user``."""


@dataclass
class Outcome:
    json: dict[str, Any] | None = None
    proto: bytes | None = None
    error: str | None = None
    category: str = "server"


async def _raise(e: Exception) -> Outcome:
    raise e


class Futures:
    """Request id -> the task computing it, then its outcome."""

    def __init__(self, keep_done: int = 4096) -> None:
        self._tasks: dict[str, asyncio.Task] = {}
        self._done: collections.OrderedDict[str, Outcome] = collections.OrderedDict()
        self._keep = keep_done

    def submit(self, kind: str, start: Callable[..., Awaitable[Outcome]], *args: Any) -> str:
        """A new request id for ``start(*args)``. ``start`` runs here, before the HTTP answer:
        it can queue its work at once (the trainer's arrival order) and check its input; an
        error it raises is the request's outcome, as one its awaitable raises is."""
        rid = f"{kind}-{uuid.uuid4().hex}"
        try:
            work = start(*args)
        except Exception as e:  # noqa: BLE001 - becomes the outcome, as in _run
            work = _raise(e)
        task = asyncio.ensure_future(self._run(rid, work))
        self._tasks[rid] = task
        return rid

    async def _run(self, rid: str, work: Awaitable[Outcome]) -> None:
        try:
            out = await work
        except UserError as e:
            out = Outcome(error=str(e), category="user")
        except Exception as e:  # noqa: BLE001 - reported to the client, logged here
            logger.exception("request %s failed", rid)
            out = Outcome(error=f"{type(e).__name__}: {e}", category="server")
        self._done[rid] = out
        self._tasks.pop(rid, None)
        while len(self._done) > self._keep:
            self._done.popitem(last=False)

    def known(self, rid: str) -> bool:
        return rid in self._tasks or rid in self._done

    async def wait(self, rid: str, timeout: float) -> Outcome | None:
        """The outcome of ``rid``, or None if it is still running after ``timeout``."""
        task = self._tasks.get(rid)
        if task is not None:
            await asyncio.wait({task}, timeout=timeout)
        return self._done.get(rid)
