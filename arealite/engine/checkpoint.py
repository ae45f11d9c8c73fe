"""Checkpoints of an FSDP2 model: HF directories (rank 0) and sharded DCP recovery checkpoints.

HF: every rank takes part in gathering the full state dict, rank 0 writes safetensors + config
(+ tokenizer), loadable by ``transformers`` and by our servers (``/update_weights_from_disk``).

DCP: model and optimizer state are saved as DTensor shards through
``torch.distributed.checkpoint`` with fully qualified names (``get_state_dict``), so a checkpoint
written on N ranks loads on M ranks (DCP reshards on load). Scheduler state, version and step
counters are small: rank 0 writes them beside the shards as ``engine_state.pt``. With ``only``
(a LoRA run: the adapter's parameters) the model part holds just those parameters: the frozen
rest is rebuilt from the base model at start, so it is neither written nor read.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from arealite.utils.fsdp import full_state_dict, reshard_all

ENGINE_STATE = "engine_state.pt"
# model kinds with a one-output head on the backbone (``num_labels=1``)
SCALAR_HEAD_KINDS = ("value", "reward")


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def save_hf(
    model: nn.Module,
    path: str | os.PathLike,
    tokenizer: Any | None = None,
    processor: Any | None = None,
) -> dict[str, torch.Tensor] | None:
    """Write an HF directory at ``path`` in the training dtype (collective; rank 0 writes),
    with ``tokenizer`` and ``processor.image_processor`` (a vision-language model's) when given.
    Returns the full state dict written on rank 0 (None elsewhere), e.g. to checksum it."""
    sd = full_state_dict(model, cpu_offload=True)
    if _rank() == 0:
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        # save_pretrained with an explicit state dict: the FSDP-wrapped module's own tensors
        # are shards, the gathered dict is the real model.
        # (a shallow copy: transformers empties the dict it is given, the caller gets ``sd``)
        model.save_pretrained(str(out), state_dict=dict(sd), safe_serialization=True)
        gen = getattr(model, "generation_config", None)
        if gen is not None:
            gen.save_pretrained(str(out))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(out))
        if processor is not None:  # ProcessorMixin.save_pretrained would want a video processor
            processor.image_processor.save_pretrained(str(out))
    _barrier()
    return sd if _rank() == 0 else None


def auto_model_class(model_kind: str = "causal_lm"):
    """The transformers Auto class for a model kind: ``causal_lm``, ``value`` (critic),
    ``reward`` (a reward model: sequence classification, one label) or ``image_text`` (a
    vision-language model)."""
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
        AutoModelForSequenceClassification,
        AutoModelForTokenClassification,
    )

    kinds = {"causal_lm": AutoModelForCausalLM, "value": AutoModelForTokenClassification,
             "reward": AutoModelForSequenceClassification, "image_text": AutoModelForImageTextToText}
    if model_kind not in kinds:
        raise ValueError(f"model_kind must be one of {sorted(kinds)}, got {model_kind!r}")
    return kinds[model_kind]


def causal_kind(hf_config: Any) -> str:
    """``image_text`` for a vision-language config (it has a ``vision_config``: transformers
    builds those with ``AutoModelForImageTextToText``), else ``causal_lm``."""
    return "image_text" if getattr(hf_config, "vision_config", None) is not None else "causal_lm"


def load_hf_state_dict(
    path: str | os.PathLike, dtype: torch.dtype, model_kind: str = "causal_lm"
) -> dict[str, torch.Tensor]:
    """Full state dict of the HF model at ``path`` (loaded on CPU through ``from_pretrained``, so
    transformers' own key conversions and tied weights apply). A ``value`` model loads the
    backbone of a causal LM checkpoint and initialises its one-output head (so does ``reward``)."""
    extra = {"num_labels": 1} if model_kind in SCALAR_HEAD_KINDS else {}
    m = auto_model_class(model_kind).from_pretrained(str(path), dtype=dtype, device_map=None,
                                                     **extra)
    return {k: v.detach() for k, v in m.state_dict().items()}


def _dcp_state(
    model: nn.Module, optimizer: torch.optim.Optimizer | None, only: Callable[[str], bool] | None
) -> dict[str, Any]:
    """What DCP writes or fills: the model's entries (those ``only`` keeps) and, with an
    optimizer, its state."""
    if optimizer is not None:
        msd, osd = get_state_dict(model, optimizer)
        state = {"model": msd, "optim": osd}
    else:
        msd, _ = get_state_dict(model, [])
        state = {"model": msd}
    if only is not None:
        state["model"] = {k: v for k, v in state["model"].items() if only(k)}
    return state


def save_dcp(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    path: str | os.PathLike,
    extra: dict[str, Any] | None = None,
    only: Callable[[str], bool] | None = None,
) -> None:
    """Sharded checkpoint of model (+ optimizer) at ``path``; ``extra`` (scheduler state,
    version, counters) is written by rank 0; ``only``: the model entries kept (by name).
    Collective."""
    out = Path(path)
    if _rank() == 0:
        out.mkdir(parents=True, exist_ok=True)
    _barrier()
    state = _dcp_state(model, optimizer, only)
    dcp.save(state, checkpoint_id=str(out))
    if _rank() == 0:
        tmp = out / (ENGINE_STATE + ".tmp")
        torch.save({"with_optim": optimizer is not None, **(extra or {})}, tmp)
        os.replace(tmp, out / ENGINE_STATE)
    _barrier()


def load_dcp(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    path: str | os.PathLike,
    only: Callable[[str], bool] | None = None,
) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_dcp`, on any number of ranks; returns ``extra``.
    ``only``: the model entries read (the rest of the model keeps its weights). Collective."""
    src = Path(path)
    if not (src / ENGINE_STATE).exists():
        raise FileNotFoundError(f"{src} is not a DCP checkpoint of ours (no {ENGINE_STATE})")
    extra = torch.load(src / ENGINE_STATE, weights_only=False)
    with_optim = optimizer is not None and extra.get("with_optim", False)
    if optimizer is not None and not with_optim:
        raise ValueError(f"{src} holds no optimizer state; load it with with_optim=False")
    state = _dcp_state(model, optimizer if with_optim else None, only)
    opts = StateDictOptions(strict=only is None)
    reshard_all(model)
    dcp.load(state, checkpoint_id=str(src))
    if with_optim:
        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"], options=opts)
    else:
        set_state_dict(model, [], model_state_dict=state["model"], optim_state_dict={},
                       options=opts)
    return extra
