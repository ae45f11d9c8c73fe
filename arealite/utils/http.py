"""aiohttp helpers for talking to SGLang-protocol servers: one session per event loop, JSON
calls with a deadline, and a readable message out of any of SGLang's error shapes.

Error shapes a server may send (see the protocol doc, section 1):

1. schema errors: ``{"object": "error", "message": str, "type": "Bad Request", "code": 400}``
2. the ``/generate`` contract gate: ``{"error": str}``
3. a ValueError while processing: ``{"error": {"message": str}}``
4. an HTTPException: ``{"object": "error", "message": str, "type": "<code>", "code": int}``

plus control endpoints answering ``{"success": false, "message": str}`` and plain-text bodies
(``/flush_cache``).
"""

from __future__ import annotations

import asyncio
import json
import time
import weakref
from dataclasses import dataclass
from typing import Any

import aiohttp

# Statuses worth retrying on another server: the server (or a proxy) is overloaded, restarting
# or broken. Every other 4xx is the caller's fault and is surfaced as is.
RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})

# Exceptions meaning "this server could not be reached or did not answer in time".
TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError, OSError)


class HTTPStatusError(RuntimeError):
    """A non-2xx answer; ``message`` is the server's own text extracted from its error shape."""

    def __init__(self, url: str, status: int, message: str):
        super().__init__(f"{url} -> HTTP {status}: {message}")
        self.url = url
        self.status = status
        self.message = message

    @property
    def retryable(self) -> bool:
        return self.status in RETRYABLE_STATUS or self.status >= 500


def error_message(body: Any) -> str:
    """The human-readable message inside any of SGLang's error bodies (parsed JSON or text)."""
    if isinstance(body, (bytes, bytearray)):
        body = body.decode("utf-8", errors="replace")
    if isinstance(body, str):
        try:
            body = json.loads(body)
        except ValueError:
            return body.strip() or "<empty body>"
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, str):  # shape 2
            return err
        if isinstance(err, dict) and "message" in err:  # shape 3 (and streamed errors)
            return str(err["message"])
        if "message" in body:  # shapes 1 and 4, and {"success": false, "message": ...}
            return str(body["message"])
        if "detail" in body:  # plain FastAPI HTTPException
            return str(body["detail"])
    return json.dumps(body)[:2000]


def decode_body(raw: bytes, content_type: str | None) -> Any:
    """JSON when the body parses as JSON, else text (``/flush_cache`` answers text/plain)."""
    if not raw:
        return None
    if content_type and "json" in content_type:
        try:
            return json.loads(raw)  # the hot path: no intermediate str
        except ValueError:
            pass
    text = raw.decode("utf-8", errors="replace")
    if not text.lstrip().startswith(("{", "[")):
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def make_session(limit: int = 0, headers: dict[str, str] | None = None) -> aiohttp.ClientSession:
    """A session with keep-alive connections (``limit`` 0 = no cap on concurrent connections).
    ``headers`` go on every call (the api key's ``Authorization``: set once here, the hot path
    builds nothing per request; a call's own headers override them)."""
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=0, keepalive_timeout=60)
    # No session-wide timeout: every call passes its own deadline.
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None),
                                 headers=headers or None)


class DeadlineWatch:
    """Cancels tasks whose deadline has passed, checking every ``tick`` seconds.

    The ``/generate`` hot path: aiohttp's per-request timeout machinery (or one timer handle per
    request) costs several microseconds of a ~100 us loopback request; a dict entry costs a
    fraction of one. Deadlines fire up to ``tick`` late, fine for request timeouts of seconds
    to hours. One watch per event loop.
    """

    def __init__(self, tick: float = 0.25):
        self.tick = tick
        self._deadlines: dict[asyncio.Task, float] = {}
        self._expired: set[asyncio.Task] = set()
        self._handle: asyncio.TimerHandle | None = None

    def add(self, task: asyncio.Task, deadline: float) -> None:
        """``deadline`` on the ``time.monotonic()`` clock."""
        self._deadlines[task] = deadline
        if self._handle is None:
            self._handle = asyncio.get_running_loop().call_later(self.tick, self._check)

    def remove(self, task: asyncio.Task) -> bool:
        """Stop watching ``task``; True when its deadline had fired (it was cancelled by us)."""
        self._deadlines.pop(task, None)
        if task in self._expired:
            self._expired.discard(task)
            return True
        return False

    def _check(self) -> None:
        now = time.monotonic()
        for task, deadline in list(self._deadlines.items()):
            if now >= deadline:
                del self._deadlines[task]
                self._expired.add(task)
                task.cancel()
        self._handle = (
            asyncio.get_running_loop().call_later(self.tick, self._check) if self._deadlines else None
        )


def uncancel(task: asyncio.Task) -> None:
    """Undo the count of one cancellation (Python >= 3.11 counts them; a no-op before), after
    a ``DeadlineWatch`` cancellation was turned into a timeout."""
    undo = getattr(task, "uncancel", None)
    if undo is not None:
        undo()


class SessionCache:
    """One ``aiohttp.ClientSession`` (and one ``DeadlineWatch``) per running event loop.

    A session is bound to the loop that created it, and a client may be used from the executor's
    loop and from a caller's own loop (``asyncio.run`` in a script); sessions of loops that have
    gone away are dropped with them.
    """

    def __init__(self, headers: dict[str, str] | None = None) -> None:
        self.headers = dict(headers or {})  # default headers of every session (see make_session)
        self._per_loop: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, tuple[aiohttp.ClientSession, DeadlineWatch]
        ] = weakref.WeakKeyDictionary()
        self._last: tuple[asyncio.AbstractEventLoop, tuple] | None = None

    def get_with_watch(self) -> tuple[aiohttp.ClientSession, DeadlineWatch]:
        loop = asyncio.get_running_loop()
        last = self._last
        if last is not None and last[0] is loop:
            return last[1]  # hot path: same loop as the previous call (close_current resets it)
        entry = self._per_loop.get(loop)
        if entry is None or entry[0].closed:
            entry = (make_session(headers=self.headers), DeadlineWatch())
            self._per_loop[loop] = entry
        self._last = (loop, entry)
        return entry

    def get(self) -> aiohttp.ClientSession:
        return self.get_with_watch()[0]

    async def close_current(self) -> None:
        """Close the session of the running loop (call from that loop)."""
        self._last = None
        entry = self._per_loop.pop(asyncio.get_running_loop(), None)
        if entry is not None and not entry[0].closed:
            await entry[0].close()


@dataclass(slots=True)
class HTTPResult:
    status: int
    body: Any


async def request_json(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    payload: Any = None,
    timeout: float | None = None,
    headers: dict[str, str] | None = None,
) -> HTTPResult:
    """One call; returns status and decoded body. Raises only transport errors and timeouts.
    ``headers`` add to (and override) the session's, e.g. the admin key's ``Authorization``."""
    t = aiohttp.ClientTimeout(total=timeout)
    kwargs: dict[str, Any] = {"timeout": t}
    if payload is not None:
        kwargs["json"] = payload
    if headers:
        kwargs["headers"] = headers
    async with session.request(method, url, **kwargs) as resp:
        raw = await resp.read()
        return HTTPResult(resp.status, decode_body(raw, resp.headers.get("Content-Type")))


async def call_json(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    payload: Any = None,
    timeout: float | None = None,
    ok_statuses: tuple[int, ...] = (),
    headers: dict[str, str] | None = None,
) -> HTTPResult:
    """Like ``request_json`` but raises ``HTTPStatusError`` on a non-2xx status (other than
    ``ok_statuses``) and on a 200 body ``{"success": false, ...}``."""
    res = await request_json(session, method, url, payload, timeout, headers)
    if res.status in ok_statuses:
        return res
    if not 200 <= res.status < 300:
        raise HTTPStatusError(url, res.status, error_message(res.body))
    if isinstance(res.body, dict) and res.body.get("success") is False:
        raise HTTPStatusError(url, res.status, error_message(res.body))
    return res


def describe_error(e: BaseException) -> str:
    """A short reason for logs and aggregated errors (timeouts have an empty ``str``)."""
    if isinstance(e, HTTPStatusError):
        return f"HTTP {e.status}: {e.message}"
    if isinstance(e, asyncio.TimeoutError):
        return "timed out"
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
