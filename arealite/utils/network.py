"""Networking helpers: server address lists, free loopback ports, waiting for an HTTP endpoint."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request

LOOPBACK = "127.0.0.1"


def parse_addrs(value: str | list[str] | None, source: str = "server address") -> list[str]:
    """``"h:p,h:p"`` or a list -> ``["h:p", ...]``; an ``http://`` prefix and a trailing ``/`` are
    dropped, empty items skipped. Anything else than host:port with a port in 1..65535 raises
    ``ValueError`` naming ``source`` (the one parser of the client and the launcher)."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    out = []
    for it in items:
        a = str(it).strip().removeprefix("http://").rstrip("/")
        if not a:
            continue
        host, _, port = a.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{source}: {str(it).strip()!r} is not host:port")
        out.append(a)
    return out


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


def port_is_free(port: int, host: str = "0.0.0.0") -> bool:
    """Whether a server could listen on ``host:port`` now (a port in TIME_WAIT counts as free,
    as it does for the servers and torch's stores, which set SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
