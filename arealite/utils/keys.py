"""API keys of the server pool, as the client sends them (SGLang's ``--api-key`` /
``--admin-api-key`` rules, docs/protocol.md section 1).

A key comes from the config when set there, else from the environment
(``AREALITE_API_KEY`` / ``AREALITE_ADMIN_API_KEY``), so it can stay out of YAML files, command
lines and logs. Headers are built once: the ``/generate`` hot path only passes a dict along.
Nothing here ever formats a key into a message.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from arealite.utils.http import TRANSPORT_ERRORS, request_json

API_KEY_ENV = "AREALITE_API_KEY"
ADMIN_API_KEY_ENV = "AREALITE_ADMIN_API_KEY"
SECRET_ENV = (API_KEY_ENV, ADMIN_API_KEY_ENV)

HINT = {
    "api": f"set rollout.api_key or {API_KEY_ENV} to the servers' --api-key",
    "admin": f"set rollout.admin_api_key or {ADMIN_API_KEY_ENV} to the servers' --admin-api-key "
             "(or, with no admin key on the servers, their --api-key)",
}


def resolve(value: str | None, env_name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """``value`` when set, else the environment variable; empty strings mean unset."""
    environ = os.environ if environ is None else environ
    return value or environ.get(env_name) or None


@dataclass(frozen=True)
class ClientKeys:
    """The keys a client sends. ``api`` goes on every call; ``admin`` (falling back to ``api``,
    as a server without an admin key accepts the api key on admin endpoints) on weight, pause
    and version calls."""

    api_key: str | None = field(default=None, repr=False)
    admin_api_key: str | None = field(default=None, repr=False)

    @classmethod
    def from_config(cls, api_key: str | None, admin_api_key: str | None,
                    environ: Mapping[str, str] | None = None) -> ClientKeys:
        return cls(resolve(api_key, API_KEY_ENV, environ),
                   resolve(admin_api_key, ADMIN_API_KEY_ENV, environ))

    @property
    def api_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    @property
    def admin_headers(self) -> dict[str, str]:
        key = self.admin_api_key or self.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}


async def check_api_key(session: Any, addrs: list[str], timeout: float, keys: ClientKeys) -> None:
    """Fail at start-up, not at the first rollout, when a server refuses our api key:
    ``/model_info`` is open without ``--api-key`` and needs it with one (``/health`` is always
    open, so it cannot tell)."""
    async def one(a: str) -> str | None:
        try:
            res = await request_json(session, "GET", f"http://{a}/model_info",
                                     timeout=min(10.0, timeout))
        except TRANSPORT_ERRORS:
            return None  # reachability is the health probe's business
        return f"{a} (HTTP 401)" if res.status == 401 else None

    refused = [r for r in await asyncio.gather(*(one(a) for a in addrs)) if r]
    if refused:
        what = "was refused" if keys.api_key else "is needed (none was given)"
        raise PermissionError(f"the servers' api key {what}: {', '.join(refused)}; " + HINT["api"])
