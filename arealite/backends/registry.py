"""The client protocol of each ``launcher.server_backend``, where the servers run, and what
both imply for weight updates (the one place that maps a backend name to behaviour)."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from arealite.api.config.weights import WeightUpdateConfig
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


def weight_update_for(wu: WeightUpdateConfig, protocol: GenerateProtocol,
                      servers_on_gpu: bool = False) -> WeightUpdateConfig:
    """``wu``, with broadcast replaced by disk updates where the backend cannot receive one
    (vLLM's native weight transfer runs over NCCL: on CPU servers it cannot), and verification
    off where the servers' checksums cannot be compared; each logged, since the config asked
    otherwise."""
    if wu.type == "distributed" and not protocol.supports_broadcast and not (
            servers_on_gpu and protocol.native_transfer is not None):
        logger.warning("weight_update.type=distributed: %s servers on CPU cannot receive a "
                       "broadcast (vLLM's native weight transfer needs GPUs); updating from "
                       "disk instead", protocol.name)
        wu = wu.model_copy(update={"type": "disk"})
    elif wu.type == "tensor" and not protocol.supports_broadcast:
        logger.warning("weight_update.type=tensor: %s servers do not speak SGLang's weight-update "
                       "protocol; updating from disk instead", protocol.name)
        wu = wu.model_copy(update={"type": "disk"})
    if wu.verify and not protocol.weight_checksums:
        logger.warning("weight_update.verify: %s servers hash weights their own way (not "
                       "comparable with the trainer's checksums); updates are not verified",
                       protocol.name)
        wu = wu.model_copy(update={"verify": False})
    return wu
