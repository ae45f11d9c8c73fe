"""The gateway refuses a worker address it should not dial, before dialling it."""

from __future__ import annotations

import pytest

from servers.gateway import Gateway, normalize_url


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
