"""Loopback networking helpers: free ports and waiting for an HTTP endpoint."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request

LOOPBACK = "127.0.0.1"


def find_free_ports(n: int = 1, host: str = LOOPBACK) -> list[int]:
    """``n`` distinct ports free right now on ``host`` (held open together so they differ)."""
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


def wait_http_ok(url: str, timeout: float, interval: float = 0.2, alive=None) -> bool:
    """Poll ``url`` until it answers 200, ``timeout`` passes, or ``alive()`` returns False."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if alive is not None and not alive():
            return False
        try:
            with urllib.request.urlopen(url, timeout=min(5.0, max(0.5, timeout))) as r:
                if r.status == 200:
                    return True
        except (urllib.error.URLError, OSError, ConnectionError):
            pass
        time.sleep(interval)
    return False
