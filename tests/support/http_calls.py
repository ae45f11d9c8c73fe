"""Plain HTTP calls the server tests share (``requests``, loopback only)."""

from __future__ import annotations

import time

import requests


def post(server: str, path: str, body=None, timeout: float = 120, **kw) -> requests.Response:
    return requests.post(f"{server}{path}", json=body, timeout=timeout, **kw)


def gen(server: str, body: dict) -> dict:
    """``/generate`` that must succeed: its JSON."""
    r = post(server, "/generate", body)
    assert r.status_code == 200, r.text
    return r.json()


def wait_tokens(server: str, n: int, timeout: float = 60.0) -> None:
    """Until the server's ``num_tokens`` load (SGLang's ``/get_load``: the KV its running requests
    hold plus what waits for prefill) reaches ``n``: a test that must pause mid-generation pauses
    once tokens exist, not after a fixed sleep (on a quiet machine the requests end first)."""
    deadline = time.monotonic() + timeout
    while requests.get(f"{server}/get_load", timeout=30).json()[0]["num_tokens"] < n:
        assert time.monotonic() < deadline, f"the server never held {n} tokens"
        time.sleep(0.005)
