"""One inference server's device memory: weights plus the KV cache its configured concurrency
and context need (a formula, stated here and in docs/memory_planner.md).

    weights  = parameters x bytes(dtype) / tp
    kv_cache = 2 x layers x ceil(kv_heads / tp) x head_dim x bytes(dtype)
               x sequences x context
    logits   = sequences x vocab x 4 bytes     (one decode step's fp32 logits for sampling)

``sequences`` is what the client can have in flight on one server: ``max_concurrent_rollouts``
(default ``consumer_batch_size``) episodes x ``gconfig.n_samples``, spread over the servers,
capped by ``servers.max_running_requests``; ``context`` is ``servers.context_length``, else
``gconfig.max_new_tokens`` plus a 1,024-token prompt allowance, capped at the model's
``max_position_embeddings``. The parameter count comes from the model built on the
``meta`` device from its config (no weights read). Real SGLang also takes a static share of the
device up front (``mem_fraction_static``): that share is reported beside the need.

A server does not run out of memory when its sequences' full KV cache exceeds the device: it
admits what its KV pool holds and queues the rest. So a plan fails on a server only when its
``minimum`` (weights, one sequence's KV cache at full context, its logits) does not fit;
beyond that the plan reports how many sequences run at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from arealite.memplan.model_shapes import text_config

_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "auto": 2}


@dataclass
class ServerMemory:
    peak: int
    breakdown: dict[str, int]
    sequences: int
    context: int
    static_fraction: float | None = None
    dtype_bytes: int = 2
    tp: int = 1
    minimum: int = 0  # weights + one sequence's KV cache and logits: the least it runs with

    def concurrent(self, usable: int) -> int:
        """Sequences of full context whose KV cache fits beside the weights in ``usable``
        bytes (the servers queue the rest: a throughput limit, not an out-of-memory)."""
        per_seq = (self.minimum - self.breakdown["weights"])
        return max(0, (usable - self.breakdown["weights"]) // per_seq) if per_seq else 0

    def largest(self) -> tuple[str, int]:
        return max(self.breakdown.items(), key=lambda kv: kv[1])


def count_parameters(hf_config: dict[str, Any]) -> int:
    """Parameters of the model ``hf_config`` describes, built on the meta device (a tied head
    counted once)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = dict(hf_config)
    cfg = AutoConfig.for_model(spec.pop("model_type"), **spec)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in model.parameters())


def kv_bytes_per_token(hf_config: dict[str, Any], dtype_bytes: int, tp: int = 1) -> int:
    t = text_config(hf_config)
    heads = t["num_attention_heads"]
    kv = t.get("num_key_value_heads") or heads
    head_dim = t.get("head_dim") or t["hidden_size"] // heads
    return 2 * t["num_hidden_layers"] * math.ceil(kv / tp) * head_dim * dtype_bytes


def predict_server(hf_config: dict[str, Any], n_params: int, dtype: str, sequences: int,
                   context: int, tp: int = 1, static_fraction: float | None = None
                   ) -> ServerMemory:
    b = _BYTES.get(dtype, 2)
    weights = n_params * b // tp
    kv = kv_bytes_per_token(hf_config, b, tp) * sequences * context
    logits = sequences * int(text_config(hf_config)["vocab_size"]) * 4
    parts = {"weights": weights, "kv_cache": kv, "logits": logits}
    one = weights + (kv + logits) // sequences
    return ServerMemory(sum(parts.values()), parts, sequences, context, static_fraction, b, tp,
                        one)


def server_demand(config: Any, hf_config: dict[str, Any]) -> tuple[int, int]:
    """(sequences in flight on one server, tokens of context each) for a GRPO config."""
    r, g, s, lc = config.rollout, config.gconfig, config.servers, config.launcher
    episodes = r.max_concurrent_rollouts or r.consumer_batch_size
    seqs = math.ceil(episodes * g.n_samples / max(1, lc.n_servers))
    if s.max_running_requests:
        seqs = min(seqs, s.max_running_requests)
    longest = int(text_config(hf_config).get("max_position_embeddings") or 0) or 10 ** 9
    context = s.context_length or min(longest, g.max_new_tokens + 1024)
    return max(1, seqs), int(context)
