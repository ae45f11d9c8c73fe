"""LoRA adapters on a trained model (peft), and moving only the adapter in and out of it.

``wrap_with_lora`` turns a transformers model into a peft model whose base weights are frozen;
the FSDP2 engine wraps before sharding, so each adapter matrix is sharded with its layer.
``gather_adapter`` collects the full adapter tensors (a collective over a sharded model; every
rank calls it), ``save_adapter`` writes them in peft's format on rank 0 (loadable by
``PeftModel.from_pretrained``, by our servers' ``/load_lora_adapter`` and by SGLang's), and
``load_adapter`` puts a saved adapter back into the (sharded) model. ``ModelAdapter`` hands
them to the weight room's adapter transports (``arealite.weights.adapters``).
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from arealite.api.config.actor import LoRAConfig

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_NAME = "default"  # peft's name for a model's only adapter (dropped from saved keys)


def wrap_with_lora(model: nn.Module, cfg: LoRAConfig, model_kind: str = "causal_lm") -> nn.Module:
    """The peft model over ``model``: adapters on ``cfg.target_modules``, base weights frozen."""
    from peft import LoraConfig, get_peft_model

    lcfg = LoraConfig(
        r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules), init_lora_weights=cfg.init_lora_weights,
        bias="none", task_type="CAUSAL_LM" if model_kind == "causal_lm" else None,
    )
    try:
        with warnings.catch_warnings():
            # peft 0.21 reads transformers' deprecated `is_gradient_checkpointing` alias: a
            # FutureWarning about peft's code in every LoRA trainer's log
            warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated",
                                    category=FutureWarning)
            return get_peft_model(model, lcfg)
    except ValueError as e:  # peft: "Target modules {...} not found in the base model"
        raise ValueError(f"lora.target_modules {cfg.target_modules}: {e}") from None


def is_lora_model(model: nn.Module | None) -> bool:
    return model is not None and hasattr(model, "peft_config")


def is_adapter_param(name: str) -> bool:
    """An adapter parameter of ``wrap_with_lora``'s model (by name: a frozen copy of the
    model, e.g. one without an optimizer, holds them too)."""
    return f".{ADAPTER_NAME}." in name and ".lora_" in name


def adapter_param_names(model: nn.Module) -> list[str]:
    """Names of the adapter's parameters in ``model``."""
    return [n for n, _ in model.named_parameters() if is_adapter_param(n)]


def saved_key(param_name: str) -> str:
    """peft's on-disk key of an adapter parameter: the adapter's name is dropped."""
    return param_name.replace(f".{ADAPTER_NAME}.", ".")


def param_name_of(saved: str) -> str:
    """The inverse of :func:`saved_key` (``...lora_A.weight`` -> ``...lora_A.default.weight``)."""
    head, _, leaf = saved.rpartition(".")
    return f"{head}.{ADAPTER_NAME}.{leaf}"


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


@torch.no_grad()
def gather_adapter(model: nn.Module) -> dict[str, torch.Tensor] | None:
    """Full adapter tensors on CPU under peft's saved keys, on rank 0 (None elsewhere).
    Collective when the model is sharded: every rank calls it."""
    from torch.distributed.tensor import DTensor

    out: dict[str, torch.Tensor] = {}
    for name, p in model.named_parameters():
        if not is_adapter_param(name):
            continue
        full = p.full_tensor() if isinstance(p, DTensor) else p
        if _rank() == 0:
            out[saved_key(name)] = full.detach().to("cpu", copy=True).contiguous()
    return out if _rank() == 0 else None


def save_adapter(model: nn.Module, path: str | os.PathLike,
                 tensors: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor] | None:
    """Write the adapter at ``path`` (``adapter_config.json`` + safetensors) on rank 0.
    Collective (the adapter is gathered unless ``tensors`` already holds it on rank 0).
    Returns what was written on rank 0, None elsewhere."""
    from safetensors.torch import save_file

    if tensors is None:
        tensors = gather_adapter(model)
    if _rank() == 0:
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(out / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        model.peft_config[ADAPTER_NAME].save_pretrained(str(out))
    return tensors


def read_adapter(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(adapter_config.json as a dict, tensors under their saved keys) of a peft folder."""
    from safetensors.torch import load_file

    src = Path(path)
    cfg_file, weights = src / ADAPTER_CONFIG, src / ADAPTER_WEIGHTS
    if not cfg_file.is_file() or not weights.is_file():
        raise FileNotFoundError(f"{src} is not a LoRA adapter folder (needs {ADAPTER_CONFIG} "
                                f"and {ADAPTER_WEIGHTS})")
    return json.loads(cfg_file.read_text()), load_file(str(weights))


@torch.no_grad()
def load_adapter(model: nn.Module, path: str | os.PathLike) -> None:
    """Copy the adapter saved at ``path`` into ``model`` (collective: rank 0 reads the folder,
    every rank takes its shard). Raises ``ValueError`` when the tensors do not fit the model."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    names = adapter_param_names(model)
    tensors: dict[str, torch.Tensor] = {}
    err = [None]
    if _rank() == 0:
        try:
            tensors = read_adapter(path)[1]
            want = {saved_key(n) for n in names}
            if set(tensors) != want:
                missing, extra = sorted(want - set(tensors)), sorted(set(tensors) - want)
                err[0] = (f"adapter at {path} does not fit this model: missing "
                          f"{missing[:3]}, unexpected {extra[:3]}")
        except (OSError, ValueError) as e:
            err[0] = str(e)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(err, src=0)  # every rank raises, none waits in a collective
    if err[0] is not None:
        raise ValueError(err[0])
    params = dict(model.named_parameters())
    for name in names:
        p = params[name]
        full = tensors.get(saved_key(name))
        if full is None:  # not rank 0: the shape and dtype to receive into
            full = torch.empty(p.shape, dtype=p.dtype)
        full = full.to(device=p.device, dtype=p.dtype)
        if isinstance(p, DTensor):
            p.to_local().copy_(distribute_tensor(full, p.device_mesh, p.placements).to_local())
        else:
            if dist.is_initialized() and dist.get_world_size() > 1:
                dist.broadcast(full, src=0)
            p.copy_(full)


def adapter_config_dict(model: nn.Module) -> dict[str, Any]:
    """The model's ``adapter_config.json`` as a JSON-ready dict (what peft writes)."""
    cfg = model.peft_config[ADAPTER_NAME].to_dict()
    return json.loads(json.dumps(cfg, default=lambda o: sorted(o) if isinstance(o, set) else str(o)))


class ModelAdapter:
    """A LoRA model's adapter as the weight transports take it (``AdapterAccess`` of
    ``arealite.weights.transport``): gathered, saved, described. Collective where noted."""

    def __init__(self, model: nn.Module):
        self.model = model

    def gather(self) -> dict[str, torch.Tensor] | None:
        return gather_adapter(self.model)

    def save(self, path: str | os.PathLike) -> None:
        save_adapter(self.model, path)

    def config(self) -> dict[str, Any]:
        return adapter_config_dict(self.model)
