"""The client protocol of each ``launcher.server_backend`` (the one place that maps a backend
name to behaviour; what it implies for weight updates is the protocol's to say and
``arealite.weights.table``'s to choose)."""

from __future__ import annotations

import logging

from arealite.backends.base import GenerateProtocol
from arealite.backends.sglang import SGLANG
from arealite.backends.vllm.protocol import VLLM

logger = logging.getLogger("arealite.backends.registry")

PROTOCOLS: dict[str, GenerateProtocol] = {"embedded": SGLANG, "sglang": SGLANG, "vllm": VLLM}


def protocol_for(server_backend: str) -> GenerateProtocol:
    try:
        return PROTOCOLS[server_backend]
    except KeyError:
        raise ValueError(f"unknown server backend {server_backend!r}: one of "
                         f"{sorted(PROTOCOLS)}") from None
