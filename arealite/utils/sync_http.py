"""One blocking JSON POST, for trainer-side calls made outside the rollout client's event loop
(the same-host weight push, the co-located phase switches)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from arealite.utils.keys import ClientKeys


def admin_headers() -> dict[str, str]:
    """The admin key from the environment (the launcher passes the run's keys that way)."""
    return ClientKeys.from_config(None, None).admin_headers


def post_json(addr: str, path: str, body: dict | None, timeout: float,
              headers: dict[str, str] | None = None) -> tuple[Any, str | None]:
    """``(answer, None)``, or ``(None, reason)`` on a transport error or a non-2xx status."""
    req = urllib.request.Request(
        f"http://{addr}{path}", data=json.dumps(body if body is not None else {}).encode(),
        headers={"Content-Type": "application/json", **(headers or {})}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read() or b"null"), None
    except urllib.error.HTTPError as e:
        return None, f"{path}: HTTP {e.code}: {e.read().decode(errors='replace')[:300]}"
    except Exception as e:  # noqa: BLE001 - connection refused, timeout: reported per server
        return None, f"{path}: {type(e).__name__}: {e}"
