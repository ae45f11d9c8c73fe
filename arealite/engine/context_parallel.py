"""Ulysses context parallelism: one packed micro-batch's tokens split over the ranks of a
context-parallel (cp) group.

Each rank embeds, projects and runs the MLPs of its own contiguous ``T / cp`` tokens. In
attention an all-to-all turns "my tokens, all heads" into "all tokens, my heads": each rank then
attends over the whole packed micro-batch (the ordinary segment layout, so per-sequence causal
masks are unchanged) for ``heads / cp`` heads, and a second all-to-all gives every rank back its
tokens with all heads. With fewer KV heads than ranks (or a count cp does not divide) the KV
heads are replicated to one per query head first. The LM head (fused or not) then scores each
rank's own tokens; FSDP2 shards the model over the whole world as without cp.

Ranks of a cp group train on the same rows: the engine concatenates the rows its cp ranks were
given (``gather_rows``), each rank keeps a token slice of every packed micro-batch
(``shard_packed``) and, for a no-grad forward, the values come back together
(``gather_tokens``) so each rank returns its own rows. The engine's glue takes ``cp=None``
(no context parallelism) everywhere, where each step is the identity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from arealite.engine import segment_attention
from arealite.engine.segment_attention import sequence_layout

ATTN_NAME = "arealite_ulysses_segments"
# packed keys that are not one value per token
NOT_PER_TOKEN = ("cu_seqlens", "max_seqlen", "segment_layout")


@dataclass
class CPGroup:
    group: dist.ProcessGroup
    size: int
    rank: int


def make_group(size: int, world_size: int, device_type: str, model_kind: str) -> CPGroup | None:
    """This rank's cp group in a data x context mesh (ranks ``i*size .. i*size+size-1`` form
    one), with the Ulysses attention registered; None for ``size`` 1. FSDP2 keeps sharding over
    the whole world. Collective: every rank calls it."""
    if size == 1:
        return None
    if world_size % size:
        raise ValueError(
            f"context_parallel_size={size} does not divide the world size {world_size}"
        )
    if model_kind != "causal_lm":
        raise ValueError(f"context_parallel_size > 1 serves causal LMs only, not {model_kind}")
    mesh = init_device_mesh(device_type, (world_size // size, size), mesh_dim_names=("dp", "cp"))
    register()
    return CPGroup(mesh.get_group("cp"), size, mesh.get_local_rank("cp"))


def check_model(cp: CPGroup | None, hf_config: Any) -> None:
    """Each rank attends for ``heads / cp`` query heads: cp must divide them."""
    heads = getattr(hf_config, "num_attention_heads", 0)
    if cp is not None and heads % cp.size:
        raise ValueError(
            f"context_parallel_size={cp.size} does not divide the model's {heads} attention heads"
        )


def token_share(cp: CPGroup | None) -> int:
    """How many ranks hold a share of each packed micro-batch's tokens (1 without cp)."""
    return 1 if cp is None else cp.size


def _all_to_all(
    x: torch.Tensor, group: dist.ProcessGroup, scatter_dim: int, gather_dim: int
) -> torch.Tensor:
    n = dist.get_world_size(group)
    send = torch.stack(x.chunk(n, dim=scatter_dim), 0).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return torch.cat(recv.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    """Scatter ``scatter_dim`` over the group, gather ``gather_dim`` in rank order; the
    backward is the same exchange the other way."""

    @staticmethod
    def forward(ctx, x, group, scatter_dim, gather_dim):
        ctx.group, ctx.dims = group, (scatter_dim, gather_dim)
        return _all_to_all(x, group, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx, g):
        s, gd = ctx.dims
        return _all_to_all(g.contiguous(), ctx.group, gd, s), None, None, None


def all_to_all(
    x: torch.Tensor, group: dist.ProcessGroup, scatter_dim: int, gather_dim: int
) -> torch.Tensor:
    return _AllToAll.apply(x, group, scatter_dim, gather_dim)


def ulysses_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout: float = 0.0,
    scaling: float | None = None,
    segment_layout=None,
    cp_group: CPGroup | None = None,
    **kwargs,
):
    """transformers attention interface over this rank's tokens: ``query [1, H, T/cp, D]``,
    ``key/value [1, Hkv, T/cp, D]`` -> ``[1, T/cp, H, D]``."""
    if cp_group is None or segment_layout is None or not getattr(module, "is_causal", True):
        return segment_attention.segment_attention(
            module, query, key, value, attention_mask, dropout, scaling, segment_layout, **kwargs
        )
    g, n = cp_group.group, cp_group.size
    H, Hkv = query.shape[1], key.shape[1]
    if Hkv % n:  # replicate KV heads: query head i reads KV head i // (H / Hkv), as in GQA
        key = key.repeat_interleave(H // Hkv, dim=1)
        value = value.repeat_interleave(H // Hkv, dim=1)
    q, k, v = (all_to_all(t, g, 1, 2) for t in (query, key, value))  # [1, H/cp, T, D]
    out, _ = segment_attention.segment_attention(
        module, q, k, v, None, dropout, scaling, segment_layout
    )
    return all_to_all(out, g, 1, 2), None  # [1, T, H/cp, D] -> [1, T/cp, H, D]


def register() -> str:
    """Register ``ulysses_attention`` with transformers (idempotent); returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, ulysses_attention)
    return ATTN_NAME


def shard_packed(p: dict, cp: CPGroup | None) -> dict:
    """This rank's slice of a packed micro-batch: the tokens (padded with a sequence of its own
    to a multiple of cp) split into cp contiguous blocks; ``cu_seqlens`` stays the whole
    micro-batch's, the attention layout covers the padding too."""
    if cp is None:
        return p
    T = int(p["cu_seqlens"][-1])
    pad = (-T) % cp.size
    t = (T + pad) // cp.size
    sl = slice(cp.rank * t, (cp.rank + 1) * t)
    out = {}
    for k, v in p.items():
        if k in NOT_PER_TOKEN or not isinstance(v, torch.Tensor) or v.dim() == 0 or v.shape[0] != T:
            out[k] = v
            continue
        if pad:
            fill = (
                torch.arange(pad, device=v.device, dtype=v.dtype)
                if k == "position_ids"
                else v.new_zeros((pad,) + tuple(v.shape[1:]))
            )
            v = torch.cat([v, fill])
        out[k] = v[sl]
    cu = p["cu_seqlens"].long().cpu()
    if pad:
        cu = torch.cat([cu, cu.new_tensor([T + pad])])
    out["segment_layout"] = sequence_layout(cu).to(p["input_ids"].device)
    out["cp_tokens"] = T
    return out


def gather_tokens(v: torch.Tensor, cp: CPGroup | None, total: int) -> torch.Tensor:
    """Every rank's per-token values of one micro-batch, in token order, ``[total]``."""
    if cp is None:
        return v
    parts = [torch.empty_like(v) for _ in range(cp.size)]
    dist.all_gather(parts, v.contiguous(), group=cp.group)
    return torch.cat(parts)[:total]


def gather_rows(data: dict, cp: CPGroup | None) -> tuple[dict, slice]:
    """The rows of every rank of the cp group, concatenated in rank order (``[B, S]`` tensors
    right-padded to the longest ``S``), and where this rank's own rows sit in it."""
    if cp is None:
        return data, slice(None)
    local = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in data.items()}
    everyone: list = [None] * cp.size
    dist.all_gather_object(everyone, local, group=cp.group)
    counts = [int(d["input_ids"].shape[0]) for d in everyone]
    S = max(int(d["input_ids"].shape[1]) for d in everyone)
    out = {}
    for k, v in data.items():
        if not isinstance(v, torch.Tensor):
            out[k] = v
            continue
        parts = []
        for d in everyone:
            x = d[k]
            if x.dim() >= 2 and x.shape[1] == d["input_ids"].shape[1] and x.shape[1] < S:
                x = torch.nn.functional.pad(x, (0, 0) * (x.dim() - 2) + (0, S - x.shape[1]))
            parts.append(x)
        out[k] = torch.cat(parts).to(v.device)
    start = sum(counts[: cp.rank])
    return out, slice(start, start + counts[cp.rank])
