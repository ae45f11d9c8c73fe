"""The gateway refuses a worker address it should not dial, before dialling it."""

from __future__ import annotations

import pytest

from servers.gateway.workers import Gateway, normalize_url


@pytest.mark.parametrize("url,want", [
    ("127.0.0.1:30000", "http://127.0.0.1:30000"),
    ("http://127.0.0.1:30000/", "http://127.0.0.1:30000"),
    ("https://node-3.cluster:8443", "https://node-3.cluster:8443"),
    ("[::1]:8000", "http://[::1]:8000"),
])
def test_good_addresses_normalise(url, want):
    assert normalize_url(url) == want


@pytest.mark.parametrize("url", ["", "0", "abc", "http://a:b", "ftp://h:1", "h:1/x", "h:1?q=1",
                                 "ôo*:1", "h:99999", "u@h:1", "h:1#f", "\x00:1"])
def test_bad_addresses_are_refused(url):
    with pytest.raises(ValueError):
        normalize_url(url)
    gw = Gateway([])
    with pytest.raises(ValueError):
        gw.add(url)
    assert gw.workers == {}


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3"])
def test_gateway_refuses_a_reachable_bind_without_a_key(host, capsys, monkeypatch):
    import uvicorn

    from servers.gateway import app as gateway

    started: list[dict] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: started.append(kw))
    monkeypatch.delenv("AREALITE_API_KEY", raising=False)
    monkeypatch.delenv("AREALITE_ADMIN_API_KEY", raising=False)
    with pytest.raises(SystemExit) as e:
        gateway.main(["--host", host])
    assert e.value.code == 2 and "--insecure" in capsys.readouterr().err and not started
    assert gateway.main(["--host", host, "--insecure"]) == 0
    monkeypatch.setenv("AREALITE_API_KEY", "k")  # a key from the environment is enough
    assert gateway.main(["--host", host]) == 0
    assert [kw["host"] for kw in started] == [host, host]
