"""Weight loading for the embedded server: disk, a broadcast group, same-host tensors.

All functions here run in the engine thread (the model is never read while they write) and
return SGLang's ``(success, message)`` pairs with SGLang's message texts. Every load is atomic:
new tensors are read and checked first, then copied in; if a copy fails midway the touched
parameters are restored, so a failed update always leaves the old weights serving.

The broadcast group is built exactly as SGLang builds it (docs/protocol.md §6): a ``tcp://``
rendezvous where the trainer (rank 0) hosts the store, a ``PrefixStore(group_name)``, then
torch's ``_new_process_group_helper``; gloo on CPU, NCCL on GPUs.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

NamedTensors = list[tuple[str, torch.Tensor]]


# ---- process group (a copy of SGLang's init_custom_process_group) -------------------------
def init_custom_process_group(
    backend: str,
    init_method: str,
    world_size: int,
    rank: int,
    group_name: str,
    timeout: timedelta | None = None,
):
    """A process group that is not the default group, joined through a TCP rendezvous."""
    from torch.distributed.distributed_c10d import (
        Backend,
        PrefixStore,
        _new_process_group_helper,
        _world,
        default_pg_timeout,
        rendezvous,
    )

    timeout = timeout or default_pg_timeout
    store, rank, world_size = next(rendezvous(init_method, rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    store = PrefixStore(group_name, store)
    # torch 2.6 renamed pg_options to backend_options.
    version = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    options_name = "backend_options" if version >= (2, 6) else "pg_options"
    pg, _ = _new_process_group_helper(
        world_size, rank, [], Backend(backend), store, group_name=group_name,
        **{options_name: None}, timeout=timeout,
    )
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


class BucketBuffer:
    """A weight-update group's receive buffer for ``flattened_bucket`` calls, grown to the
    largest bucket and reused. A fresh buffer per bucket page-faults every byte before the
    broadcast can write it: on CPU that was about half of an upload's time
    (``benchmarks/micro/weight_sync.py``). Tensors received into it alias it, so they must be copied
    into the model before the next receive, as the server does within the same call."""

    def __init__(self) -> None:
        self._buf: torch.Tensor | None = None

    def take(self, nbytes: int, device: torch.device | str) -> torch.Tensor:
        dev = torch.device(device)
        b = self._buf
        if (b is None or b.numel() < nbytes or b.device.type != dev.type
                or (dev.index is not None and b.device.index != dev.index)):
            self._buf = None  # free the old one before allocating the larger one
            b = self._buf = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        return b[:nbytes]


def receive_broadcast(
    pg, names: list[str], dtypes: list[str], shapes: list[list[int]], load_format: str | None,
    device: torch.device, buffer: BucketBuffer | None = None,
) -> NamedTensors:
    """Receive one update call's tensors from rank 0: one broadcast per tensor, or one bucket
    (into ``buffer`` when given: then the tensors alias it until its next use)."""
    import torch.distributed as dist

    if not (len(names) == len(dtypes) == len(shapes)):
        raise ValueError("names, dtypes and shapes must have the same length")
    torch_dtypes = [_dtype(d) for d in dtypes]
    if load_format == "flattened_bucket":
        metas, offset = [], 0
        for name, dtype, shape in zip(names, torch_dtypes, shapes):
            size = torch.Size(shape)
            if any(dim < 0 for dim in size):
                raise ValueError(f"Negative dimension in received tensor {name}: {size}")
            if offset % dtype.itemsize:
                raise ValueError(f"Unaligned received tensor {name}: byte offset {offset}, dtype {dtype}")
            nbytes = size.numel() * dtype.itemsize
            metas.append((name, dtype, size, offset, offset + nbytes))
            offset += nbytes
        if not metas:
            raise ValueError("Cannot create empty tensor bucket")
        flat = (buffer.take(offset, device) if buffer is not None
                else torch.empty(offset, dtype=torch.uint8, device=device))
        dist.broadcast(flat, src=0, group=pg)
        return [(n, flat[a:b].view(dt).reshape(sz)) for n, dt, sz, a, b in metas]
    received, handles = [], []
    for name, dtype, shape in zip(names, torch_dtypes, shapes):
        t = torch.empty(shape, dtype=dtype, device=device)
        handles.append(dist.broadcast(t, src=0, group=pg, async_op=True))
        received.append((name, t))
    for h in handles:
        h.wait()
    return received


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} (use torch attribute names like 'bfloat16')")
    return dt


# ---- applying tensors to the model --------------------------------------------------------
# Vision-language models (Qwen2-VL family) name their modules ``model.language_model.*`` and
# ``model.visual.*`` in memory but save checkpoints under the original names ``model.*`` and
# ``visual.*`` (SGLang's names too): a tensor is accepted under either.
_CHECKPOINT_ALIASES = (("model.language_model.", "model."), ("model.visual.", "visual."))


def _param_table(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    table = dict(model.named_parameters())
    table.update(dict(model.named_buffers()))
    for name in list(table):
        for prefix, saved in _CHECKPOINT_ALIASES:
            if name.startswith(prefix):
                table.setdefault(saved + name[len(prefix):], table[name])
    return table


def check_named_tensors(model: torch.nn.Module, named: NamedTensors) -> NamedTensors:
    """``named`` without a sent ``lm_head`` of a tied head; raises for an unknown name or a
    wrong shape (before anything is copied)."""
    table = _param_table(model)
    if getattr(model.config, "tie_word_embeddings", False) and "lm_head.weight" not in table:
        # Tied head: the embedding is the one tensor; a sent lm_head is skipped, as SGLang does.
        named = [(n, t) for n, t in named if n != "lm_head.weight"]
    for name, t in named:
        if name not in table:
            raise KeyError(f"unknown parameter {name!r}")
        if tuple(t.shape) != tuple(table[name].shape):
            raise ValueError(
                f"shape mismatch for {name}: got {tuple(t.shape)}, expected {tuple(table[name].shape)}"
            )
    return named


def apply_named_tensors(model: torch.nn.Module, named: NamedTensors, backup: bool = True) -> None:
    """Copy tensors into parameters by HF name; all-or-nothing (raises, after restoring).

    ``backup=False`` skips the copy of each old parameter that a rollback needs: for callers
    whose tensors are already in memory and checked, where a copy cannot fail halfway short of
    a crash that takes the process with it (the same-host tensor path: one copy, not two)."""
    table = _param_table(model)
    named = check_named_tensors(model, named)
    saved: dict[str, torch.Tensor] = {}
    try:
        with torch.no_grad():
            for name, t in named:
                p = table[name]
                if backup and name not in saved:
                    saved[name] = p.detach().clone()
                p.copy_(t.to(device=p.device, dtype=p.dtype))
    except Exception:
        with torch.no_grad():
            for name, old in saved.items():
                table[name].copy_(old)
        raise


def get_weights_by_name(model: torch.nn.Module, name: str, truncate_size: int = 100):
    """SGLang's shape: ``param.float().tolist()[:truncate_size]`` (rows for 2-D tensors)."""
    table = _param_table(model)
    if name not in table and name == "lm_head.weight":
        emb = model.get_input_embeddings()
        return emb.weight.float().tolist()[:truncate_size]
    if name not in table:
        return None
    return table[name].detach().float().cpu().tolist()[:truncate_size]


# ---- disk ---------------------------------------------------------------------------------
def read_checkpoint(model_path: str) -> NamedTensors:
    """All tensors of an HF checkpoint directory (safetensors, sharded or not, or .bin)."""
    path = Path(model_path)
    if not path.is_dir():
        raise FileNotFoundError(f"{model_path} is not a directory")
    files: list[Path] = []
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [path / s for s in shards]
    else:
        files = sorted(path.glob("*.safetensors")) or sorted(path.glob("pytorch_model*.bin"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors or pytorch_model*.bin weights in {model_path}")
    out: NamedTensors = []
    for f in files:
        if f.suffix == ".safetensors":
            from safetensors.torch import load_file

            out.extend(load_file(str(f)).items())
        else:
            out.extend(torch.load(str(f), map_location="cpu", weights_only=True).items())
    return out


def outside_roots(model_path: str, roots: list[str]) -> str | None:
    """Why ``model_path`` may not be loaded, or None. The path must lie inside one of ``roots``
    once every symlink and ``..`` is resolved, so neither can lead out of them."""
    try:
        real = Path(model_path).resolve(strict=False)
    except (OSError, RuntimeError, ValueError) as e:
        return f"model_path {model_path!r} cannot be resolved: {e}"
    for root in roots:
        if real.is_relative_to(Path(root).resolve(strict=False)):
            return None
    return (f"model_path {model_path!r} is outside the folders this server loads weights from "
            f"({', '.join(roots)}); start it with --weight-load-root to allow another")


def update_weights_from_disk(model: torch.nn.Module, model_path: str) -> tuple[bool, str]:
    try:
        named = read_checkpoint(model_path)
    except Exception as e:
        return False, f"Failed to get weights iterator: {e}."
    try:
        apply_named_tensors(model, named)
    except Exception as e:
        return False, f"Failed to update weights: {e}.\nRolling back to original weights."
    return True, "Succeeded to update model weights."
