"""Shared bits of the engine tests: configs and random trajectories for the tiny model."""

from __future__ import annotations

import random

import torch

from arealite.api.config.actor import OptimizerConfig, PPOActorConfig, TrainEngineConfig
from arealite.api.trajectory import pad_sequences_to_tensors


def engine_config(path, cls=TrainEngineConfig, **kw):
    opt = kw.pop("optimizer", OptimizerConfig(lr=1e-3, gradient_clipping=1.0))
    return cls(path=str(path), optimizer=opt, max_tokens_per_mb=kw.pop("max_tokens_per_mb", 64), **kw)


def actor_config(path, **kw):
    return engine_config(path, cls=PPOActorConfig, **kw)


def random_trajectories(n: int, seed: int = 0, vocab: int = 300, min_len: int = 4,
                        max_len: int = 20, group_size: int = 1) -> dict[str, torch.Tensor]:
    """``n`` rows following the trajectory contract (prompt then generated tokens)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        L = rng.randint(min_len, max_len)
        p = rng.randint(1, L - 1)
        rows.append({
            "input_ids": [rng.randint(3, vocab - 1) for _ in range(L)],
            "loss_mask": [0] * p + [1] * (L - p),
            "logprobs": [0.0] * p + [-rng.uniform(0.5, 6.0) for _ in range(L - p)],
            "versions": [-1] * p + [0] * (L - p),
            "rewards": float(rng.random() < 0.5) if group_size > 1 or i % 3 else 0.3,
        })
    return pad_sequences_to_tensors(rows)
