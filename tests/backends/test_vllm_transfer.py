"""The client's native-transfer bodies (``vllm_transfer``) and the backend -> update-type
mapping. The bodies are checked against real vLLM's parsers in
``test_vllm_backend_integration.py``; here, their exact shape (recorded from vLLM 0.32's
``NCCLWeightTransferInitInfo`` / ``NCCLWeightTransferUpdateInfo`` and its ``/finish_weight_update``
route), and the one-line errors where the path cannot run."""

from __future__ import annotations

import logging

import pytest
import torch

from arealite.api.config.weights import WeightUpdateConfig
from arealite.api.io_struct import ParamSpec, WeightUpdateMeta
from arealite.backends.registry import servers_on_cpu
from arealite.backends.sglang import SGLANG
from arealite.backends.vllm import weight_transfer as vt
from arealite.backends.vllm.protocol import VLLM
from arealite.weights.table import choose_transport

SPECS = [[ParamSpec("a.weight", (4, 2), "float32"), ParamSpec("b", (3,), "bfloat16")],
         [ParamSpec("c.weight", (2, 2, 2), "float32")]]


def test_bodies_are_vllms_init_update_and_finish_infos():
    meta = WeightUpdateMeta.broadcast(7, SPECS, master_port=2345, master_address="10.0.0.1",
                                      bucket_size_mb=0.5)
    assert vt.init_payload(meta, 3, 9) == {"init_info": {
        "master_address": "10.0.0.1", "master_port": 2345, "rank_offset": 3, "world_size": 9,
        "packed": True, "packed_buffer_size_bytes": 524288, "packed_num_buffers": 2}}
    # one receive for the whole model, in the order the trainer sends (buckets flattened)
    assert vt.update_payload(SPECS) == {"update_info": {
        "names": ["a.weight", "b", "c.weight"], "dtype_names": ["float32", "bfloat16", "float32"],
        "shapes": [[4, 2], [3], [2, 2, 2]]}}
    assert vt.finish_payload(7) == {"weight_version": "7"}


def test_distributed_on_vllm_is_native_on_gpus_and_disk_on_cpu(caplog):
    wu = WeightUpdateConfig(type="distributed", verify=False)
    assert choose_transport(wu, False, VLLM, servers_on_gpu=True)[1].type == "distributed"
    with caplog.at_level(logging.WARNING, "arealite.weights.table"):
        assert choose_transport(wu, False, VLLM, servers_on_gpu=False)[1].type == "disk"
    assert "needs GPUs" in caplog.text
    assert choose_transport(wu, False, SGLANG, servers_on_gpu=False)[1].type == "distributed"


def test_servers_are_on_cpu_when_asked_or_given_no_gpu():
    assert servers_on_cpu("cpu", 1, {"CUDA_VISIBLE_DEVICES": "0"})
    assert servers_on_cpu("auto", 0, {})
    # the GPUs come from the launcher (gpus_per_server) or the servers' own environment
    assert not servers_on_cpu("auto", 1, {})
    assert not servers_on_cpu("auto", 0, {"CUDA_VISIBLE_DEVICES": "0"})
    assert not servers_on_cpu("cuda", 0, {})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-host error")
def test_trainer_send_on_a_cpu_host_is_one_clear_error():
    from arealite.weights.upload import DistributedUploader, WeightUploadError

    model = torch.nn.Linear(4, 2)
    specs = [[ParamSpec("weight", (2, 4), "float32"), ParamSpec("bias", (2,), "float32")]]
    meta = WeightUpdateMeta.broadcast(1, specs, master_port=1, timeout=5)
    meta.receiver, meta.world_size = "vllm", 2  # as the client publishes them
    with pytest.raises(WeightUploadError, match="weight_update.type=disk") as ei:
        DistributedUploader("gloo", torch.device("cpu")).upload(model, meta, is_rank0=True)
    assert "\n" not in str(ei.value)
