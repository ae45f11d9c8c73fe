"""The gateway's worker list: the servers' addresses (checked before any is dialled), their
health (a probe loop; ``/health`` counts only servers that answered their last probe), the
round-robin order of routed calls, and the counters ``/metrics`` reads
(``servers.gateway.metrics``). The routes over it are ``servers.gateway.app``."""

from __future__ import annotations

import asyncio
import itertools
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp

_HOST = re.compile(r"[A-Za-z0-9.\-]{1,253}|\[[0-9A-Fa-f:.]+\]|[0-9A-Fa-f:.]+")


def normalize_url(url: str) -> str:
    """``host:port`` or ``http(s)://host:port`` -> ``http(s)://host:port``; ValueError (a 400)
    for anything else, so a bad worker address is refused instead of being dialled."""
    url = url.strip().rstrip("/")
    if not url:
        raise ValueError("empty server address")
    url = url if "://" in url else f"http://{url}"
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    host = parts.hostname or ""
    if (parts.scheme not in ("http", "https") or port is None or parts.path or parts.query
            or parts.fragment or parts.username or not _HOST.fullmatch(host)):
        raise ValueError(f"a server address is host:port or http(s)://host:port, got {url!r}")
    return url


@dataclass
class Worker:
    url: str
    healthy: bool = True
    failures: int = 0
    sent: int = 0  # /generate calls proxied to it (/metrics)
    unreachable: int = 0

    def as_dict(self) -> dict:
        return {"id": self.url, "url": self.url, "is_healthy": self.healthy,
                "worker_type": "regular", "connection_mode": "http"}


class Gateway:
    def __init__(self, urls: list[str], health_interval: float = 5.0, failure_threshold: int = 3,
                 request_timeout: float = 3600.0, api_key: str | None = None,
                 admin_api_key: str | None = None) -> None:
        self.api_key = api_key or None
        self.admin_api_key = admin_api_key or None
        self.workers: dict[str, Worker] = {}
        for u in urls:
            self.add(u)
        self.health_interval = health_interval
        self.failure_threshold = failure_threshold
        self.request_timeout = request_timeout
        self._rr = itertools.count()
        self.no_worker = 0  # /generate answered 503 (/metrics)
        self.fanouts: dict[str, int] = {}
        self.session: aiohttp.ClientSession | None = None
        self.probed_once = False  # /health says 503 until every worker has been probed once

    def add(self, url: str) -> Worker:
        url = normalize_url(url)
        return self.workers.setdefault(url, Worker(url))

    def remove(self, url: str) -> bool:
        return self.workers.pop(normalize_url(url), None) is not None

    def healthy(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.healthy]

    def answering(self) -> int:
        """Workers whose last probe answered: what /health reports. Routing is more tolerant
        (a worker leaves it after failure_threshold misses), but a count of servers that
        answered must never include one that was not asked, or that did not answer."""
        if not self.probed_once:
            return 0
        return sum(1 for w in self.workers.values() if w.healthy and w.failures == 0)

    def pick_order(self) -> list[Worker]:
        """Healthy workers in round-robin order starting at the next one."""
        ws = self.healthy()
        if not ws:
            return []
        k = next(self._rr) % len(ws)
        return ws[k:] + ws[:k]

    async def check(self, w: Worker) -> None:
        try:
            async with self.session.get(f"{w.url}/health",
                                        timeout=aiohttp.ClientTimeout(total=5)) as r:
                ok = r.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError):
            ok = False
        if ok:
            w.failures, w.healthy = 0, True
        else:
            w.failures += 1
            if w.failures >= self.failure_threshold:
                w.healthy = False

    async def health_loop(self) -> None:
        while True:
            await asyncio.gather(*(self.check(w) for w in list(self.workers.values())))
            self.probed_once = True
            await asyncio.sleep(self.health_interval)
