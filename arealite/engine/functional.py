"""Tensor helpers the trainer shares: label logprobs (and entropy) from logits or from the
fused head's hidden states, masked means and normalisation, mask indexing. No algorithm lives here: PPO's losses and advantages are in
``arealite.engine.ppo.loss`` and ``arealite.engine.ppo.advantages``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from arealite.engine.lm_head import HeadInput, fused_logprobs
from arealite.utils.distributed import all_reduce as reduce_across

# --------------------------------------------------------------------------- logprobs
#
# ``scores`` is either the logits ``[N, V]`` or a ``HeadInput`` (hidden states + head weight,
# ``arealite.engine.lm_head``): the engine hands loss functions the latter by default, and
# every function here computes the same numbers from both, the fused form without ever holding
# an ``[N, V]`` tensor beyond one chunk.


def _on_rows(fn, logits: torch.Tensor | HeadInput, labels: torch.Tensor, mask: torch.Tensor,
             *args) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """``fn(logits, labels, *args)`` on the rows of ``mask`` (``[N]`` bool) only, scattered back
    to ``[N]`` with 0 elsewhere (and no gradient there).

    Why: the trainer's losses read a token's logprob only under their loss mask, and after a
    long prompt with a short answer most rows are masked out, while the head's ``[rows, H] x
    [H, V]`` products are the update's largest cost at a real vocabulary (SmolLM2-135M, 4 x 8
    rows of ~80 prompt and ~10 answer tokens: 7.8 of 13 s per update on all rows)."""
    index = torch.nonzero(mask.reshape(-1).bool()).squeeze(-1)
    part = logits.select(index) if isinstance(logits, HeadInput) else logits.index_select(0, index)
    got = fn(part, labels.index_select(0, index), *args)
    n = labels.shape[0]
    if isinstance(got, tuple):
        return tuple(g.new_zeros(n).index_copy(0, index, g) for g in got)
    return got.new_zeros(n).index_copy(0, index, got)


def _chunked(logits: torch.Tensor, chunk_size: int):
    n = logits.shape[0]
    step = max(1, int(chunk_size))
    for i in range(0, n, step):
        yield slice(i, min(n, i + step))


def gather_logprobs(
    logits: torch.Tensor | HeadInput,
    labels: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """``log_softmax(logits / temperature)[i, labels[i]]`` for ``logits [N, V]``, in row chunks;
    with ``mask`` only its rows (0 elsewhere, see ``_on_rows``).

    Written as ``logit[label] - logsumexp(logits)``: autograd then keeps no ``[N, V]``
    softmax per chunk (logsumexp's backward recomputes it from the logits), so chunking bounds
    the peak memory of forward *and* backward to one ``[chunk, V]`` temporary. A ``HeadInput``
    goes through the fused head (its own chunk size).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if mask is not None:
        return _on_rows(gather_logprobs, logits, labels, mask, temperature, chunk_size)
    if isinstance(logits, HeadInput):
        h = logits
        return fused_logprobs(h.hidden, h.weight, labels, temperature, h.chunk_size, h.bias)[0]
    outs = []
    for sl in _chunked(logits, chunk_size):
        x = logits[sl].float()
        if temperature != 1.0:
            x = x / temperature
        picked = x.gather(-1, labels[sl].long().unsqueeze(-1)).squeeze(-1)
        outs.append(picked - torch.logsumexp(x, dim=-1))
    # no rows: an empty result still on the graph (a loss of it back-propagates zeros)
    return torch.cat(outs) if outs else logits[:, 0].float()


@torch.no_grad()
def gather_logprobs_entropy(
    logits: torch.Tensor | HeadInput,
    labels: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Label logprobs and the entropy of ``softmax(logits / temperature)`` per row (no grad);
    with ``mask`` only its rows (0 elsewhere)."""
    if mask is not None:
        return _on_rows(gather_logprobs_entropy, logits, labels, mask, temperature, chunk_size)
    if isinstance(logits, HeadInput):
        h = logits
        lp, ent = fused_logprobs(
            h.hidden, h.weight, labels, temperature, h.chunk_size, h.bias, with_entropy=True
        )
        return lp, ent
    lps, ents = [], []
    for sl in _chunked(logits, chunk_size):
        x = logits[sl].float() / temperature
        logp = torch.log_softmax(x, dim=-1)
        lps.append(logp.gather(-1, labels[sl].long().unsqueeze(-1)).squeeze(-1))
        ents.append(-(logp.exp() * logp).sum(-1))
    if not lps:
        z = logits.new_zeros(0, dtype=torch.float32)
        return z, z.clone()
    return torch.cat(lps), torch.cat(ents)


def logprobs_and_entropy(
    logits: torch.Tensor | HeadInput,
    labels: torch.Tensor,
    temperature: float = 1.0,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Label logprobs (differentiable) and the entropy per row (detached) in one call: the
    fused head computes both in a single pass over the vocabulary; logits take two passes.
    With ``mask`` only its rows (0 elsewhere)."""
    if mask is not None:
        return _on_rows(logprobs_and_entropy, logits, labels, mask, temperature)
    if isinstance(logits, HeadInput):
        h = logits
        lp, ent = fused_logprobs(
            h.hidden, h.weight, labels, temperature, h.chunk_size, h.bias, with_entropy=True
        )
        return lp, ent.detach()
    lp = gather_logprobs(logits, labels, temperature)
    return lp, gather_logprobs_entropy(logits.detach(), labels, temperature)[1]


@torch.no_grad()
def greedy_tokens(logits: torch.Tensor | HeadInput) -> torch.Tensor:
    """``argmax`` over the vocabulary per row (chunked for a ``HeadInput``)."""
    if isinstance(logits, HeadInput):
        out = torch.empty(len(logits), dtype=torch.long, device=logits.hidden.device)
        for sl, z in logits.chunks():
            out[sl] = z.argmax(-1)
        return out
    return logits.argmax(-1)


def zero_loss(logits: torch.Tensor | HeadInput) -> torch.Tensor:
    """A zero connected to every parameter the scores came from (FSDP's collectives of a rank
    with nothing to learn must still match the others')."""
    if isinstance(logits, HeadInput):
        return logits.zero_loss()
    return logits.sum() * 0.0


# --------------------------------------------------------------------------- normalisation


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    if mask is None:
        return x.float().mean()
    m = mask.to(x.dtype)
    return (x * m).sum() / m.sum().clamp_min(1)


@torch.no_grad()
def masked_normalization(
    x: torch.Tensor,
    mask: torch.Tensor | None = None,
    dim: int | tuple[int, ...] | None = None,
    unbiased: bool = False,
    eps: float = 1e-5,
    high_precision: bool = True,
    all_reduce: bool = True,
    reduce_group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """``(x - mean) / (std + eps)`` over the masked entries, with the moments summed across the
    ranks of ``reduce_group`` (when torch.distributed is initialised and ``all_reduce``), so
    every rank normalises with the global batch statistics. Masked-out entries return 0."""
    dtype = torch.float64 if high_precision else torch.float32
    xd = x.to(dtype)
    dims = tuple(range(x.dim())) if dim is None else ((dim,) if isinstance(dim, int) else dim)
    m = torch.ones_like(xd) if mask is None else mask.to(dtype)
    xd = xd * m
    count = m.sum(dims, keepdim=True)
    s1 = xd.sum(dims, keepdim=True)
    s2 = xd.square().sum(dims, keepdim=True)
    if all_reduce and dist.is_available() and dist.is_initialized():
        stacked = torch.cat([count.reshape(-1), s1.reshape(-1), s2.reshape(-1)])
        dev = stacked.device
        if dist.get_backend(reduce_group) == "nccl" and dev.type != "cuda":
            stacked = stacked.cuda()
        reduce_across(stacked, group=reduce_group)
        count, s1, s2 = (t.reshape(count.shape).to(dev) for t in stacked.chunk(3))
    mean = s1 / count.clamp_min(1)
    var = (s2 / count.clamp_min(1) - mean.square()).clamp_min(0)
    if unbiased:
        var = var * count / (count - 1).clamp_min(1)
    return (((xd - mean) / (var.sqrt() + eps)) * m).float()


# --------------------------------------------------------------------------- masks


def last_true_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last True per row of ``[B, S]`` (-1 for an all-False row)."""
    S = mask.shape[1]
    idx = torch.arange(S, device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), idx, torch.full_like(idx, -1)).max(1).values
