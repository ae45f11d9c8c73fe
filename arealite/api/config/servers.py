"""The ``servers`` section: how the inference servers are started, whichever backend
(``launcher.server_backend``) serves. Its fields keep SGLang's flag names.

The section was called ``sglang:``; a file or override that still says so loads as ``servers``
with one warning line (``rename_legacy_section``, used by ``arealite.api.config.loader``)."""

from __future__ import annotations

import logging
from typing import Any, Literal

from pydantic import Field

from arealite.api.config.base import BaseConfig

logger = logging.getLogger("arealite.api.config.servers")


class ServersConfig(BaseConfig):
    """Server launch settings, whichever backend serves (embedded, SGLang or vLLM; flags named
    as ``python -m sglang.launch_server``'s)."""

    model_path: str = Field("", description="Model dir; empty uses the actor's path.")
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = Field(
        "auto", description="--dtype"
    )
    random_seed: int | None = Field(1, description="--random-seed")
    context_length: int | None = Field(None, ge=1, description="--context-length")
    max_running_requests: int | None = Field(None, ge=1, description="--max-running-requests")
    mem_fraction_static: float | None = Field(None, gt=0, le=1, description="--mem-fraction-static")
    tp_size: int = Field(1, ge=1, description="--tp-size")
    skip_tokenizer_init: bool = Field(False, description="--skip-tokenizer-init")
    enable_metrics: bool = Field(False, description="--enable-metrics")
    enable_return_routed_experts: bool = Field(
        False, description="--enable-return-routed-experts: MoE servers report each token's "
        "experts (SGLang, vLLM and the embedded server); on by itself under actor.routing_replay.")
    log_level: str = Field("warning", description="--log-level")
    device: str = Field("auto", description="--device (cpu, cuda, auto)")
    api_key: str | None = Field(None, description="--api-key")
    admin_api_key: str | None = Field(None, description="--admin-api-key")
    extra_args: list[str] = Field(default_factory=list, description="More flags, passed verbatim.")


# The section's old name: still read, so configs and scripts written for it keep working.
LEGACY_SECTION = "sglang"


def rename_legacy_section(data: dict[str, Any]) -> bool:
    """Move a file's old ``sglang:`` section into ``servers:`` in place (its keys winning where
    both sections set one); True when there was one to move."""
    if LEGACY_SECTION not in data:
        return False
    old, new = data.pop(LEGACY_SECTION), data.get("servers")
    data["servers"] = {**new, **old} if isinstance(new, dict) and isinstance(old, dict) else old
    return True


def rename_legacy_override(key: list[str]) -> bool:
    """``sglang.x=...`` -> ``servers.x=...`` in place (``key`` split on dots); True when renamed."""
    if key and key[0] == LEGACY_SECTION:
        key[0] = "servers"
        return True
    return False


def warn_legacy_section() -> None:
    """The one line a config that still says ``sglang`` gets."""
    logger.warning("config: the `sglang` section is now called `servers`: rename `sglang:` to "
                   "`servers:` (and `sglang.x=...` overrides to `servers.x=...`)")
