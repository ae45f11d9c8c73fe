"""The client protocol of each ``launcher.server_backend`` and where the servers run (the one
place that maps a backend name to behaviour; what it implies for weight updates is the
protocol's to say and ``arealite.weights.table``'s to choose)."""

from __future__ import annotations

import logging
from collections.abc import Mapping

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


def servers_on_cpu(device: str, gpus_per_server: int, environ: Mapping[str, str]) -> bool:
    """Whether the inference servers run on CPU: ``servers.device: cpu``, or ``auto`` with no
    GPU given (``environ`` is the servers' environment: the launcher's, not a trainer's, whose
    ``CUDA_VISIBLE_DEVICES`` names the trainer's GPUs)."""
    return device == "cpu" or (device == "auto" and gpus_per_server == 0
                               and not environ.get("CUDA_VISIBLE_DEVICES"))

