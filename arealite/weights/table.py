"""The weight-transport table: every transport by name, and the one choice of it.

``choose_transport`` picks the transport once, from the config (``weight_update.type``, LoRA
or not) and the server backend (``launcher.server_backend``'s protocol, and whether its servers
run on GPUs); ``weight_meta`` then stamps its name on every update (``meta.transport``), and
both halves look it up here. An update built by hand (tests, benchmarks) carries no name: its
transport follows from ``meta.type``, LoRA or not, and whether the client's backend has a
native transfer (``transport_for``).

| name             | ``weight_update.type`` | LoRA | backend                        |
|------------------|------------------------|------|--------------------------------|
| ``disk``         | disk                   | no   | any                            |
| ``broadcast``    | distributed            | no   | SGLang's group (SGLang, ours)  |
| ``vllm``         | distributed            | no   | vLLM, servers on GPUs          |
| ``tensor``       | tensor                 | no   | SGLang's routes, same host     |
| ``adapter_disk`` | disk                   | yes  | any                            |
| ``adapter_memory`` | tensor               | yes  | SGLang's routes, same host     |

A combination a backend cannot receive falls back to disk, with one warning line; LoRA over a
broadcast is refused (one line).
"""

from __future__ import annotations

import logging

from arealite.api.config.weights import WeightUpdateConfig
from arealite.api.io_struct import WeightUpdateMeta
from arealite.backends.base import GenerateProtocol
from arealite.weights.adapters import AdapterFromDisk, AdapterFromMemory
from arealite.weights.broadcast import BroadcastTransport
from arealite.weights.disk import DiskTransport
from arealite.weights.tensor import TensorTransport
from arealite.weights.transport import WeightTransport
from arealite.weights.vllm_native import VLLMNativeTransport

logger = logging.getLogger("arealite.weights.table")

TRANSPORTS: dict[str, type[WeightTransport]] = {t.name: t for t in (
    DiskTransport, BroadcastTransport, VLLMNativeTransport, TensorTransport,
    AdapterFromDisk, AdapterFromMemory,
)}
_INSTANCES = {name: cls() for name, cls in TRANSPORTS.items()}  # stateless: one each

LORA_BROADCAST = ("actor.lora pushes only its adapter, through disk or in memory: set "
                  "weight_update.type=disk or tensor")


def transport_name(update_type: str, lora: bool, native: bool = False) -> str:
    """The table's name for an update of ``update_type`` (``disk``, ``distributed``,
    ``tensor``), LoRA or not, to servers with (``native``) or without a native transfer."""
    if update_type == "distributed":
        if lora:
            raise ValueError(LORA_BROADCAST)
        return VLLMNativeTransport.name if native else BroadcastTransport.name
    names = {"disk": (DiskTransport.name, AdapterFromDisk.name),
             "tensor": (TensorTransport.name, AdapterFromMemory.name)}
    if update_type not in names:
        raise ValueError(f"unknown weight_update.type {update_type!r}: one of disk, "
                         "distributed, tensor")
    return names[update_type][lora]


def transport(name: str) -> WeightTransport:
    """The transport called ``name``."""
    try:
        return _INSTANCES[name]
    except KeyError:
        raise ValueError(f"unknown weight transport {name!r}: one of "
                         f"{sorted(TRANSPORTS)}") from None


def transport_for(meta: WeightUpdateMeta, lora: bool | None = None,
                  native: bool = False) -> WeightTransport:
    """The transport of ``meta``: the one ``choose_transport`` named, or for an update built
    by hand the one its type implies (``lora``: the trainer's own model; None: whether the
    update names an adapter)."""
    if meta.transport is not None:
        return transport(meta.transport)
    lora = meta.lora_name is not None if lora is None else lora
    return transport(transport_name(meta.type.value, lora, native))


def choose_transport(
    wu: WeightUpdateConfig, lora: bool, protocol: GenerateProtocol, servers_on_gpu: bool = False,
) -> tuple[type[WeightTransport], WeightUpdateConfig]:
    """The run's transport, and ``wu`` as it runs: broadcast replaced by disk where the
    backend cannot receive one (vLLM's native weight transfer runs over NCCL: on CPU servers it
    cannot), tensor by disk where the backend lacks SGLang's routes, verification off where the
    servers' checksums cannot be compared; each logged, since the config asked otherwise."""
    native = protocol.native_transfer is not None  # distributed updates go over it
    if wu.type == "distributed" and not protocol.supports_broadcast and not (
            servers_on_gpu and native):
        logger.warning("weight_update.type=distributed: %s servers on CPU cannot receive a "
                       "broadcast (vLLM's native weight transfer needs GPUs); updating from "
                       "disk instead", protocol.name)
        wu = wu.model_copy(update={"type": "disk"})
    elif wu.type == "tensor" and not protocol.supports_broadcast:
        logger.warning("weight_update.type=tensor: %s servers do not speak SGLang's weight-update "
                       "protocol; updating from disk instead", protocol.name)
        wu = wu.model_copy(update={"type": "disk"})
    cls = TRANSPORTS[transport_name(wu.type, lora, native)]
    if wu.verify and not protocol.weight_checksums:
        logger.warning("weight_update.verify: %s servers hash weights their own way (not "
                       "comparable with the trainer's checksums); updates are not verified",
                       protocol.name)
        wu = wu.model_copy(update={"verify": False})
    return cls, wu
