"""A random right-padded batch for the math tests: attention and loss masks over [B, S]."""

from __future__ import annotations

import torch

TOL = 1e-6


def rand_batch(seed: int, B: int = 6, S: int = 9):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(3, S + 1, (B,), generator=g)
    prompt = torch.randint(1, 3, (B,), generator=g)
    am = torch.arange(S)[None] < lens[:, None]
    lm = am & (torch.arange(S)[None] >= prompt[:, None])
    lm[0] = False  # a row with nothing generated
    lm[0, :] = False
    return g, am, lm
