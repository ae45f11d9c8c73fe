"""The RL run's consistency gate (``weight_update.consistency``), built once: its probe prompts
are the first rows of the held-out set (the training set when there is none), encoded as the
training workflow encodes them, so the gate reads the distributions the rollouts sample from.

Off, with one log line, where it cannot read them the same way on both sides: a LoRA run (the
servers sample from an adapter), a vision-language model (the probes carry no images), a
backend other than SGLang's protocol (``top_logprobs_num``), or rows the workflow cannot
encode.
"""

from __future__ import annotations

import logging
from typing import Any

from arealite.api.config.experiment import GRPOConfig
from arealite.weights.consistency_gate import ConsistencyGate

logger = logging.getLogger("arealite.trainer.consistency_probes")


def encode_probes(workflow: Any, rows: list[dict[str, Any]], n: int) -> list[list[int]]:
    """Up to ``n`` prompts: the workflow's own encoding (``encode(row) -> (ids, text)``), else
    a row's ``input_ids``."""
    out = []
    for row in rows[:n]:
        encode = getattr(workflow, "encode", None)
        if callable(encode):
            ids = encode(row)[0]
        elif "input_ids" in row:
            ids = row["input_ids"]
        else:
            continue
        if ids:
            out.append([int(t) for t in ids])
    return out


def build_gate(
    config: GRPOConfig,
    workflow: Any,
    rows: list[dict[str, Any]],
    rank: int,
    headers: dict[str, str] | None,
    vision: bool = False,
) -> ConsistencyGate | None:
    """The run's gate, or None (off by config, or where it cannot read both sides alike)."""
    cfg = config.weight_update.consistency
    if not cfg.enabled:
        return None
    off = None
    if config.actor.lora is not None:
        off = "actor.lora: the servers sample from an adapter"
    elif config.launcher.server_backend == "vllm":
        off = f"launcher.server_backend={config.launcher.server_backend} has no top_logprobs_num"
    elif vision:
        off = "a vision-language workflow (the probes would carry no images)"
    prompts = [] if off else encode_probes(workflow, rows, cfg.probes)
    if not off and not prompts:
        off = "no row the workflow can encode"
    if off:
        if rank == 0:
            logger.warning("consistency gate off: %s", off)
        return None
    return ConsistencyGate(cfg, prompts, config.gconfig, config.actor.temperature, rank, headers)
