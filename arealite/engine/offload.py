"""Moving a trainer's model and optimizer state off the accelerator between phases, and back.

Co-located mode (``launcher.colocate``) hands the accelerator to the inference servers while
they generate: the actor's parameters and optimizer state (and a reference model's parameters,
after its log-probabilities are computed) go to host memory and come back before they are
needed. ``module.to`` moves FSDP2's sharded parameters (each rank its own shard); optimizer
state tensors are moved one by one; gradients are dropped first (the step used them).

On a CPU trainer the parameters already live in host memory: there is nothing to free, and
both functions return 0 without touching anything (what co-location frees on CPU is the
servers' memory: ``/release_memory_occupation``). The accelerator path is untested on our CPU
machines.
"""

from __future__ import annotations

import torch
from torch import nn


def _state_tensors(optimizer: torch.optim.Optimizer | None):
    if optimizer is None:
        return
    for state in optimizer.state.values():
        for k, v in state.items():
            if isinstance(v, torch.Tensor):
                yield state, k, v


def _nbytes(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> int:
    n = sum(p.numel() * p.element_size() for p in model.parameters())
    return n + sum(v.numel() * v.element_size() for _, _, v in _state_tensors(optimizer))


def move_to(model: nn.Module, optimizer: torch.optim.Optimizer | None,
            device: torch.device | str) -> int:
    """Parameters and optimizer state to ``device``; returns the bytes moved (0 on CPU)."""
    device = torch.device(device)
    first = next(model.parameters(), None)
    if first is None or first.device.type == "cpu" and device.type == "cpu":
        return 0
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    model.to(device)
    for state, k, v in list(_state_tensors(optimizer)):
        state[k] = v.to(device, non_blocking=True)
    if device.type != "cpu":
        torch.get_device_module(device).synchronize()
    else:
        torch.get_device_module(first.device).synchronize()
        torch.get_device_module(first.device).empty_cache()
    return _nbytes(model, optimizer)
