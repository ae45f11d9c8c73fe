"""Loopback networking for servers/: free ports and health polling (no arealite imports)."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable

LOOPBACK = "127.0.0.1"


def find_free_ports(n: int = 1, host: str = LOOPBACK) -> list[int]:
    """``n`` distinct ports free right now on ``host`` (bound together so they differ)."""
    socks, ports = [], []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def find_free_port(host: str = LOOPBACK) -> int:
    return find_free_ports(1, host)[0]


def http_ok(url: str, timeout: float = 2.0, headers: dict | None = None) -> bool:
    try:
        req = urllib.request.Request(url, headers=headers or {})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ConnectionError, ValueError):
        return False


def wait_healthy(
    url: str, timeout: float, alive: Callable[[], bool] | None = None, interval: float = 0.2
) -> bool:
    """Poll ``url`` until it answers 200, ``timeout`` passes, or ``alive()`` turns False."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if alive is not None and not alive():
            return False
        if http_ok(url, timeout=min(5.0, max(0.5, timeout))):
            return True
        time.sleep(interval)
    return False
