"""Bearer-token auth with SGLang's rules (``--api-key`` / ``--admin-api-key``).

- ``/health*``, ``/ready*`` and ``/metrics*`` are always open (probes and scrapers).
- Admin endpoints (weights, pause, cache): with an admin key only the admin key opens them; with
  just an api key that key does; with neither they are open.
- Everything else needs the api key when one is set.
Failures answer ``401 {"error": "Unauthorized"}``. The gateway applies the same rules with its
own admin routes (worker-list changes) through ``is_admin``.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

from fastapi.responses import JSONResponse

ADMIN_PATHS = frozenset({
    "/flush_cache", "/abort_request", "/pause_generation", "/continue_generation",
    "/update_weights_from_disk", "/init_weights_update_group", "/destroy_weights_update_group",
    "/update_weights_from_distributed", "/update_weights_from_tensor", "/begin_weight_update",
    "/end_weight_update", "/update_weight_version", "/get_weights_by_name",
    "/release_memory_occupation", "/resume_memory_occupation", "/weights_checker",
    "/load_lora_adapter", "/load_lora_adapter_from_tensors", "/unload_lora_adapter",
})


def is_admin_path(method: str, path: str) -> bool:
    """The server's admin endpoints (SGLang's ``ADMIN_OPTIONAL``)."""
    return path in ADMIN_PATHS

OPEN_PREFIXES = ("/health", "/ready", "/metrics")


def _bearer_ok(header: str | None, expected: str) -> bool:
    if not header:
        return False
    parts = header.split(" ", 1)
    if len(parts) != 2 or parts[0].lower() != "bearer":
        return False
    return secrets.compare_digest(parts[1].encode(), expected.encode())


def allowed(method: str, path: str, header: str | None, api_key: str | None,
            admin_api_key: str | None,
            is_admin: Callable[[str, str], bool] = is_admin_path) -> bool:
    """Pure decision function (unit-tested)."""
    if method == "OPTIONS" or path.startswith(OPEN_PREFIXES):
        return True
    if is_admin(method, path):
        if admin_api_key:
            return _bearer_ok(header, admin_api_key)
        if api_key:
            return _bearer_ok(header, api_key)
        return True
    if api_key:
        return _bearer_ok(header, api_key)
    return True


class ApiKeyMiddleware:
    """Plain ASGI middleware (keeps client-disconnect events intact for streaming)."""

    def __init__(self, app, api_key: str | None, admin_api_key: str | None,
                 is_admin: Callable[[str, str], bool] = is_admin_path) -> None:
        self.app = app
        self.api_key = api_key
        self.admin_api_key = admin_api_key
        self.is_admin = is_admin

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or (not self.api_key and not self.admin_api_key):
            await self.app(scope, receive, send)
            return
        header = None
        for k, v in scope.get("headers", []):
            if k == b"authorization":
                header = v.decode("latin-1")
                break
        if allowed(scope.get("method", "GET"), scope.get("path", ""), header,
                   self.api_key, self.admin_api_key, self.is_admin):
            await self.app(scope, receive, send)
            return
        await JSONResponse({"error": "Unauthorized"}, status_code=401)(scope, receive, send)
