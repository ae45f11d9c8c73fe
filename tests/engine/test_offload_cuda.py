"""The trainer's offload on a CUDA device (``pytest -m cuda``; skipped without one): moving the
FSDP2 model and its optimizer state to host memory frees their device memory, and moving them
back restores the same numbers. Run by ``benchmarks/gpu_check`` on a lent GPU."""

from __future__ import annotations

import pytest
import torch

from arealite.api.io_struct import FinetuneSpec
from arealite.engine.fsdp_engine import FSDPEngine
from arealite.engine.functional import gather_logprobs
from arealite.engine.offload import move_to
from tests.support.fsdp_helpers import engine_config, random_trajectories

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _state_bytes(e: FSDPEngine) -> int:
    params = sum(p.numel() * p.element_size() for p in e.model.parameters())
    opt = sum(
        v.numel() * v.element_size()
        for st in e.optimizer.state.values()
        for v in st.values()
        if torch.is_tensor(v) and v.is_cuda
    )
    return params + opt


def test_offload_frees_parameters_and_optimizer_and_onload_restores(tiny_model_dir):
    e = FSDPEngine(engine_config(tiny_model_dir), device="cuda", backend="nccl")
    e.initialize(ft_spec=FinetuneSpec(total_train_epochs=1, dataset_size=8, train_batch_size=8))
    try:
        data = random_trajectories(8, seed=0)

        def loss(logits, mb):
            return -(gather_logprobs(logits, mb["labels"]) * mb["loss_mask"]).sum()

        e.train_batch(data, loss, lambda mb: float(mb["loss_mask"].sum()))  # Adam state exists
        ref = e.forward(data)
        held = _state_bytes(e)
        torch.cuda.synchronize()
        on = torch.cuda.memory_allocated()
        moved = move_to(e.model, e.optimizer, "cpu")
        off = torch.cuda.memory_allocated()
        print(
            f"offload: {held / 2**20:.2f} MiB of parameters and optimizer state; "
            f"allocated {on / 2**20:.2f} -> {off / 2**20:.2f} MiB"
        )
        assert moved >= held * 0.99
        assert on - off >= 0.9 * held
        assert next(e.model.parameters()).device.type == "cpu"
        move_to(e.model, e.optimizer, "cuda")
        assert torch.cuda.memory_allocated() - off >= 0.9 * held
        assert torch.equal(e.forward(data), ref)
    finally:
        e.destroy()
