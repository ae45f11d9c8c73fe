"""The shared half of the context-parallel check: the engine, the batch, and the gradient of
``sum_mb loss_mb * w_mb / sum w`` accumulated as ``FSDPEngine.train_batch`` does (without its
optimizer step, so the gradients themselves can be compared)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from arealite.engine.fsdp_engine import FSDPEngine
from arealite.engine.functional import logprobs_and_entropy
from tests.support.fsdp_helpers import engine_config, random_trajectories


def make_engine(model_dir, cp: int) -> FSDPEngine:
    e = FSDPEngine(
        engine_config(
            model_dir,
            context_parallel_size=cp,
            init_from_scratch=True,
            max_tokens_per_mb=40,
            logprob_chunk_size=9,
        ),
        device="cpu",
        backend="gloo",
    )
    e.initialize()
    return e


def batch() -> dict:
    return random_trajectories(6, seed=21, min_len=5, max_len=23)


def loss_fn(out, mb) -> torch.Tensor:
    """Per-token terms only (each cp rank holds a token slice), entropy with gradient."""
    lm = mb["loss_mask"].float()
    lp, _ = logprobs_and_entropy(out, mb["labels"], 0.8)
    return -((lp * (1.0 + mb["logprobs"])) * lm).sum() / lm.sum().clamp_min(1)


def loss_and_grads(e: FSDPEngine, rows: dict, reduce: Callable[[torch.Tensor], None]):
    mbl = e.split_micro_batches(rows)
    packed = [e.pack(mb, idx) for mb, idx in zip(mbl.mbs, mbl.indices)]
    w = [float(p["loss_mask"].sum()) if idx else 0.0 for p, idx in zip(packed, mbl.indices)]
    total = torch.tensor([sum(w)], dtype=torch.float64)
    reduce(total)
    loss_sum = torch.zeros(1, dtype=torch.float64)
    e.model.zero_grad(set_to_none=True)
    for p, wi in zip(packed, w):
        out = e.model_forward(p)
        loss = loss_fn(out, p) if wi > 0 else out.zero_loss()
        (loss * (wi / float(total) * e.world_size)).backward()
        loss_sum += float(loss.detach()) * wi
    reduce(loss_sum)
    grads = {n: p.grad for n, p in e.model.named_parameters() if p.grad is not None}
    return float(loss_sum) / float(total), grads
