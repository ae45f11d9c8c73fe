"""The weight-transport table: each ``weight_update.type`` x LoRA x backend picks its class
once (``choose_transport``), the meta it builds names that class, both halves find it again
(``transport_for``), and a combination nothing can run is one line of error."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from arealite.api.config.weights import WeightUpdateConfig
from arealite.api.io_struct import ParamSpec, WeightUpdateMeta
from arealite.backends.sglang import SGLANG
from arealite.backends.vllm.protocol import VLLM
from arealite.weights.adapters import AdapterFromDisk, AdapterFromMemory
from arealite.weights.broadcast import BroadcastTransport
from arealite.weights.disk import DiskTransport
from arealite.weights.push import weight_meta
from arealite.weights.table import TRANSPORTS, choose_transport, transport, transport_for
from arealite.weights.tensor import TensorTransport
from arealite.weights.vllm_native import VLLMNativeTransport

SPECS = [[ParamSpec("w", (2, 2), "float32")]]


class Actor:  # what weight_meta asks of the trainer engine
    def get_param_specs(self, bucket_size_mb: float) -> list[list[ParamSpec]]:
        return SPECS


@pytest.mark.parametrize("update_type, lora, protocol, on_gpu, want", [
    ("disk", False, SGLANG, False, DiskTransport),
    ("disk", False, VLLM, True, DiskTransport),
    ("distributed", False, SGLANG, False, BroadcastTransport),
    ("distributed", False, VLLM, True, VLLMNativeTransport),
    ("distributed", False, VLLM, False, DiskTransport),  # vLLM's NCCL transfer needs GPUs
    ("tensor", False, SGLANG, False, TensorTransport),
    ("tensor", False, VLLM, True, DiskTransport),  # no /update_weights_from_tensor
    ("disk", True, SGLANG, False, AdapterFromDisk),
    ("disk", True, VLLM, False, AdapterFromDisk),
    ("tensor", True, SGLANG, False, AdapterFromMemory),
    ("tensor", True, VLLM, False, AdapterFromDisk),
])
def test_each_type_lora_and_backend_picks_its_transport(update_type, lora, protocol, on_gpu,
                                                        want, tmp_path):
    wu = WeightUpdateConfig(type=update_type, verify=False)
    cls, ran = choose_transport(wu, lora, protocol, on_gpu)
    assert cls is want and TRANSPORTS[cls.name] is cls
    # the meta of each version names it, and both halves find it again from the meta
    meta = weight_meta(ran, 3, tmp_path / "exp" / "trial" / "weights", 1234, Actor(), cls)
    assert meta.transport == cls.name and meta.version == 3
    assert type(transport_for(meta)) is cls
    assert (meta.lora_name is not None) == lora
    if lora:
        assert meta.lora_name == "exp-trial-v3" and meta.verify is False


def test_falling_back_or_unverifiable_is_one_warning_line(caplog):
    wu = WeightUpdateConfig(type="tensor", verify=True)
    with caplog.at_level(logging.WARNING, "arealite.weights.table"):
        cls, ran = choose_transport(wu, False, VLLM, servers_on_gpu=True)
    assert cls is DiskTransport and ran.type == "disk" and ran.verify is False
    assert len(caplog.records) == 2 and all("\n" not in r.getMessage() for r in caplog.records)
    assert wu.type == "tensor" and wu.verify  # the config itself is left as written


def test_lora_over_a_broadcast_is_one_line_error():
    wu = WeightUpdateConfig(type="distributed", verify=False)
    with pytest.raises(ValueError, match="weight_update.type=disk or tensor") as ei:
        choose_transport(wu, True, SGLANG)
    assert "\n" not in str(ei.value)
    meta = WeightUpdateMeta.broadcast(1, SPECS, master_port=1)
    with pytest.raises(ValueError, match="weight_update.type=disk or tensor"):
        transport_for(meta, lora=True)  # a LoRA engine handed a broadcast update


def test_unknown_names_are_one_line_errors():
    with pytest.raises(ValueError, match="unknown weight transport 'pigeon'"):
        transport("pigeon")
    meta = WeightUpdateMeta.disk(1, "/tmp/x")
    meta.transport = "pigeon"
    with pytest.raises(ValueError, match="one of"):
        transport_for(meta)


def test_hand_built_metas_follow_their_type_lora_and_the_client_backend(tmp_path: Path):
    disk = WeightUpdateMeta.disk(1, tmp_path)
    assert type(transport_for(disk)) is DiskTransport
    assert type(transport_for(disk, lora=True)) is AdapterFromDisk  # a LoRA engine's half
    disk.lora_name = "run-v1"
    assert type(transport_for(disk)) is AdapterFromDisk  # the client sees the adapter's name
    tensor = WeightUpdateMeta.tensor(1)
    assert type(transport_for(tensor)) is TensorTransport
    assert type(transport_for(tensor, lora=True)) is AdapterFromMemory
    bcast = WeightUpdateMeta.broadcast(1, SPECS, master_port=1)
    assert type(transport_for(bcast)) is BroadcastTransport
    assert type(transport_for(bcast, native=True)) is VLLMNativeTransport  # a vLLM client
    # only full-weight broadcasts are retried over the survivors; only disk leaves a copy
    assert [n for n, c in TRANSPORTS.items() if c.retryable] == ["broadcast", "vllm"]
    assert transport_for(disk, lora=False).disk_copy(disk) is disk
    assert transport_for(bcast).disk_copy(bcast) is None
