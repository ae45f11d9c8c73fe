"""FSDP2 helpers: sharding a HF causal LM, full state dicts, gradient norm/clipping, schedules.

Everything here is device- and backend-agnostic: the same calls run on CPU with gloo and on
GPUs with NCCL; only the mesh's device type and the dtypes (from config) differ.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.tensor import DTensor

from arealite.utils.distributed import all_reduce

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def to_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a HF model: modules whose class is in ``_no_split_modules``
    (how HF marks its decoder layers), falling back to ``model.model.layers``."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    found = [m for m in model.modules() if type(m).__name__ in names]
    if found:
        return found
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"cannot find decoder layers in {type(model).__name__}")
    return list(layers)


def apply_fsdp2(
    model: nn.Module,
    mesh: DeviceMesh,
    param_dtype: torch.dtype,
    reduce_dtype: torch.dtype,
    cpu_offload: bool = False,
) -> nn.Module:
    """``fully_shard`` every decoder layer, then the root (embeddings, norm, head)."""
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype,
                              cast_forward_inputs=True)
    offload: OffloadPolicy = CPUOffloadPolicy(pin_memory=True) if cpu_offload else OffloadPolicy()
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=mp, offload_policy=offload)
    fully_shard(model, mesh=mesh, mp_policy=mp, offload_policy=offload)
    return model


def full_state_dict(model: nn.Module, cpu_offload: bool = True) -> dict[str, torch.Tensor]:
    """Unsharded state dict (collective: every rank calls it; with ``cpu_offload`` only rank 0
    keeps the tensors, on CPU)."""
    return get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=cpu_offload)
    )


def load_full_state_dict(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load a full state dict held by rank 0 into a sharded model (collective).

    ``set_model_state_dict(..., broadcast_from_rank0=True)`` modifies the dict it is given, so
    it gets clones: the caller's dict stays usable.
    """
    reshard_all(model)
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    src = {k: v.detach().clone() for k, v in state.items()} if rank0 else {}
    set_model_state_dict(
        model,
        src,
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=True),
    )


def reshard_all(model: nn.Module) -> None:
    """Put every FSDP module back into its sharded state. After a forward the root module keeps
    its parameters unsharded (it does not reshard after forward); loading a state dict into
    that state fails with "mixed torch.Tensor and DTensor"."""
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The unsharded value of a parameter (all-gather for a DTensor: a collective)."""
    return t.full_tensor() if isinstance(t, DTensor) else t


@torch.no_grad()
def grad_norm(params: Iterable[nn.Parameter], group: dist.ProcessGroup | None = None) -> float:
    """Global L2 norm of the gradients of sharded (DTensor) and plain parameters.

    Local shards are squared and summed, then all-reduced over ``group``; plain (replicated)
    tensors are counted once. Returns ``inf``/``nan`` when any gradient is non-finite.
    """
    sharded = torch.zeros((), dtype=torch.float64)
    plain = torch.zeros((), dtype=torch.float64)
    dev = None
    for p in params:
        g = p.grad
        if g is None:
            continue
        if isinstance(g, DTensor):
            local = g.to_local()
            dev = local.device
            sharded = sharded.to(dev) + local.double().square().sum()
        else:
            dev = g.device
            plain = plain.to(dev) + g.double().square().sum()
    if dist.is_initialized():
        if dist.get_backend(group) == "nccl":
            dev = torch.device("cuda", torch.cuda.current_device())
        sharded = sharded.to(dev or "cpu")
        all_reduce(sharded, group=group)
    return float((sharded.cpu() + plain.cpu()).sqrt())


@torch.no_grad()
def clip_grads_(params: list[nn.Parameter], max_norm: float, total_norm: float) -> None:
    """Scale gradients in place so their global norm is at most ``max_norm``."""
    coef = max_norm / (total_norm + 1e-6)
    if coef < 1.0:
        for p in params:
            if p.grad is not None:
                p.grad.mul_(coef)


# --------------------------------------------------------------------------- lr schedules


class WarmupDecay:
    """lr multiplier: linear warm-up to 1 over ``warmup_steps``, then constant, linear or
    cosine decay to ``min_lr_ratio`` at ``total_steps``. A class (not a lambda) so that
    ``LambdaLR.state_dict()`` saves its settings with the checkpoint."""

    def __init__(self, kind: str, total_steps: int, warmup_steps: int, min_lr_ratio: float):
        if kind not in ("constant", "linear", "cosine"):
            raise ValueError(f"lr_scheduler_type must be constant/linear/cosine, got {kind!r}")
        self.kind = kind
        self.total_steps = max(1, int(total_steps))
        self.warmup_steps = max(0, int(warmup_steps))
        self.min_lr_ratio = float(min_lr_ratio)

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / (self.warmup_steps + 1)
        if self.kind == "constant":
            return 1.0
        span = max(1, self.total_steps - self.warmup_steps)
        frac = min(1.0, (step - self.warmup_steps) / span)
        if self.kind == "linear":
            decay = 1.0 - frac
        else:
            decay = 0.5 * (1.0 + math.cos(math.pi * frac))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * decay


def make_lr_scheduler(
    optimizer: torch.optim.Optimizer,
    kind: str,
    total_steps: int,
    warmup_proportion: float,
    min_lr_ratio: float,
    warmup_steps: int | None = None,
) -> torch.optim.lr_scheduler.LambdaLR:
    """``warmup_steps`` (absolute) wins over ``warmup_proportion`` of ``total_steps``."""
    warmup = int(warmup_proportion * total_steps) if warmup_steps is None else warmup_steps
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, WarmupDecay(kind, total_steps, warmup, min_lr_ratio)
    )
