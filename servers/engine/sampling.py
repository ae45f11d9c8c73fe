"""Batched next-token sampling: temperature, top-k, top-p, min-p, penalties, seeds, logprobs.

Plain tensor functions; ``tests/servers/test_sampling.py`` checks them against a slow loop.

SGLang's conventions, mirrored here:
- greedy (temperature < 1e-6) is temperature 1 with top_k 1;
- the reported logprob of a sampled token is ``log_softmax(logits / T)`` at that token, taken
  *before* top-k / top-p / min-p filtering (the trainer recomputes exactly this);
- top-k, top-p and min-p filter the sorted probabilities together: rank >= k is dropped, a
  token is dropped when the mass strictly before it exceeds p, and min-p drops tokens below
  ``min_p * max_prob``.
Sampling draws with the exponential race (Gumbel-max): the argmax of logp minus log Exp(1)
noise. A request with ``sampling_seed`` takes its noise from a hash of (seed, position, token id), so its output does not depend on which other requests share
the batch; the others take noise from the server's generator (``--random-seed``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_M32 = 0xFFFFFFFF


@dataclass
class BatchSampling:
    """Per-row sampling settings for one batch, as tensors of length B."""

    temperatures: torch.Tensor  # float32, > 0 (greedy rows hold 1.0)
    top_ks: torch.Tensor  # int64, >= 1 (vocab size or more = no top-k)
    top_ps: torch.Tensor  # float32 in (0, 1]
    min_ps: torch.Tensor  # float32 in [0, 1]
    seeds: torch.Tensor  # int64; only rows where ``seeded`` is True are used
    seeded: torch.Tensor  # bool
    positions: torch.Tensor  # int64: the sequence length before the sampled token
    all_greedy: bool = False
    needs_filter: bool = True


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``(x * c) mod 2**32`` for 0 <= x < 2**32 without int64 overflow (split the constant)."""
    lo = (x * (c & 0xFFFF)) & _M32
    hi = ((x * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & _M32


def _fmix32(x: torch.Tensor) -> torch.Tensor:
    """murmur3's 32-bit finaliser: a well-mixed hash of a 32-bit value."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def hashed_uniform(seeds: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """Uniform noise in (0, 1), ``[B, vocab]`` float64, a pure function of (seed, position, id)."""
    s = seeds.to(torch.int64)
    h = _fmix32((s & _M32) ^ _fmix32((s >> 32) & _M32))
    h = _fmix32(h ^ _mul32(positions.to(torch.int64) & _M32, 0x27D4EB2F))
    cols = torch.arange(vocab, device=seeds.device, dtype=torch.int64)
    x = _fmix32(h.view(-1, 1) ^ _mul32(cols, 0x165667B1).view(1, -1))
    return (x.to(torch.float64) + 0.5) / 4294967296.0


def race_noise(batch: BatchSampling, vocab: int, generator: torch.Generator | None) -> torch.Tensor:
    """Log of Exp(1) noise ``[B, vocab]``: ``argmax(logp - noise)`` samples from ``softmax(logp)``
    (the exponential race, i.e. Gumbel-max). Hashed for seeded rows, drawn otherwise."""
    b = batch.temperatures.shape[0]
    device = batch.temperatures.device
    e = torch.empty((b, vocab), device=device).exponential_(generator=generator)
    if bool(batch.seeded.any()):
        rows = batch.seeded.nonzero().view(-1)
        u = hashed_uniform(batch.seeds[rows], batch.positions[rows], vocab)
        e[rows] = (-torch.log(u)).float()
    return e.clamp_(min=1e-30).log_()


def filter_mask_sorted(
    sorted_probs: torch.Tensor, top_ks: torch.Tensor, top_ps: torch.Tensor, min_ps: torch.Tensor
) -> torch.Tensor:
    """True where a token (in descending-probability order) is filtered out."""
    ranks = torch.arange(sorted_probs.shape[-1], device=sorted_probs.device).view(1, -1)
    drop = ranks >= top_ks.view(-1, 1)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    drop |= mass_before > top_ps.view(-1, 1)
    drop |= sorted_probs < (sorted_probs[:, :1] * min_ps.view(-1, 1))
    return drop


def sample(
    logits: torch.Tensor, batch: BatchSampling, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample one token per row of float32 ``logits [B, V]``.

    Returns ``(tokens [B] int64, token_logprobs [B] float32, logprobs [B, V] float32)`` where
    ``logprobs`` is ``log_softmax(logits / T)`` (pre-filtering), clamped to the float minimum so
    that no logprob is -inf.
    """
    logprobs = torch.log_softmax(logits / batch.temperatures.view(-1, 1), dim=-1)
    logprobs.clamp_(min=torch.finfo(logprobs.dtype).min)
    if batch.all_greedy:
        tokens = logits.argmax(dim=-1)
    elif not batch.needs_filter:
        noise = race_noise(batch, logits.shape[-1], generator)
        tokens = (logprobs - noise).argmax(dim=-1)
    else:
        probs = logprobs.exp()
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        drop = filter_mask_sorted(sorted_probs, batch.top_ks, batch.top_ps, batch.min_ps)
        sorted_logp = torch.gather(logprobs, 1, order).masked_fill(drop, float("-inf"))
        noise = torch.gather(race_noise(batch, logits.shape[-1], generator), 1, order)
        # Greedy rows (top_k 1) keep only rank 0: the noise cannot change their pick.
        pick = (sorted_logp - noise).argmax(dim=-1, keepdim=True)
        tokens = torch.gather(order, 1, pick).view(-1)
    token_logprobs = torch.gather(logprobs, 1, tokens.view(-1, 1)).view(-1)
    return tokens, token_logprobs, logprobs


def apply_penalties(
    logits: torch.Tensor,
    rows: list[int],
    histories: list[tuple[list[int], list[int]]],
    frequency: list[float],
    presence: list[float],
    repetition: list[float],
) -> None:
    """In place, for the listed rows: SGLang's frequency/presence penalties over output tokens
    and the repetition penalty over prompt + output tokens."""
    vocab = logits.shape[-1]
    for row, (prompt, output), f, p, r in zip(rows, histories, frequency, presence, repetition):
        if output and (f != 0.0 or p != 0.0):
            counts = torch.bincount(torch.tensor(output, dtype=torch.int64), minlength=vocab)[:vocab]
            counts = counts.to(logits.device, logits.dtype)
            logits[row] -= f * counts + p * (counts > 0).to(logits.dtype)
        if r != 1.0:
            seen = torch.zeros(vocab, dtype=torch.bool, device=logits.device)
            ids = torch.tensor(prompt + output, dtype=torch.int64, device=logits.device)
            seen[ids[ids < vocab]] = True
            row_logits = logits[row]
            penalised = torch.where(row_logits > 0, row_logits / r, row_logits * r)
            logits[row] = torch.where(seen, penalised, row_logits)
