"""Plain HTTP calls the server tests share (``requests``, loopback only)."""

from __future__ import annotations

import requests


def post(server: str, path: str, body=None, timeout: float = 120, **kw) -> requests.Response:
    return requests.post(f"{server}{path}", json=body, timeout=timeout, **kw)


def gen(server: str, body: dict) -> dict:
    """``/generate`` that must succeed: its JSON."""
    r = post(server, "/generate", body)
    assert r.status_code == 200, r.text
    return r.json()
