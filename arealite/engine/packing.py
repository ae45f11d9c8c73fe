"""Tensor-dict helpers for the trainer: packing, micro-batches and row selection.

Trajectories follow the contract in ``arealite.api.trajectory`` (which also pads and
concatenates them): every value has leading dimension B; 2-D values are right-padded along dim 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from arealite.api.trajectory import TensorDict

# --------------------------------------------------------------------------- packing
#
# Shift convention (one place for the whole trainer): a causal LM's output at position t predicts
# token t+1. The trajectory contract stores per-token values *on the token they describe*
# (``logprobs[b, t]`` is the logprob of ``input_ids[b, t]``). When a padded batch is packed for
# the model, every per-token key except ``input_ids`` is shifted left by one inside each
# sequence (``next_token_view``), and ``labels`` (the next token id) is added, so that in a packed
# micro-batch ``logits[i]``, ``labels[i]``, ``loss_mask[i]``, ``logprobs[i]`` ... all describe the
# same prediction. The last position of each sequence predicts nothing: mask False, label 0.
# ``unpack_to_padded(..., shift_back=True)`` undoes the shift for values returned to the caller.


def seqlens_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Real length of each row of a right-padded ``[B, S]`` mask (checked to be a prefix)."""
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must be [B, S], got shape {tuple(attention_mask.shape)}")
    am = attention_mask.bool()
    lens = am.sum(1)
    prefix = torch.arange(am.shape[1], device=am.device)[None, :] < lens[:, None]
    if not torch.equal(prefix, am):
        raise ValueError("attention_mask must be right-padded (True on a prefix of each row)")
    return lens.long()


# per-row values whose dim 1 is not the token axis, whatever its length (a row's image patches)
NON_TOKEN_KEYS = frozenset({"pixel_values", "image_grid_thw"})
# per-token values about the token as the model's *input* (the experts a MoE server routed it
# to), packed on their own token like ``input_ids``, never shifted to the next one
INPUT_KEYS = frozenset({"input_ids", "routed_experts"})


def is_token_key(data: TensorDict, key: str) -> bool:
    """True for values shaped like ``input_ids`` (``[B, S, ...]``)."""
    if key in NON_TOKEN_KEYS:
        return False
    ref = data["input_ids"]
    v = data[key]
    return v.dim() >= 2 and tuple(v.shape[:2]) == tuple(ref.shape[:2])


def next_token_view(x: torch.Tensor, seqlens: torch.Tensor, fill: float | bool = 0) -> torch.Tensor:
    """``out[b, t] = x[b, t + 1]`` for ``t < len_b - 1``, ``fill`` elsewhere (no wrap-around)."""
    out = torch.full_like(x, fill)
    out[:, :-1] = x[:, 1:]
    keep = torch.arange(x.shape[1], device=x.device)[None, :] < (seqlens[:, None] - 1)
    while keep.dim() < x.dim():
        keep = keep.unsqueeze(-1)
    return torch.where(keep, out, torch.full_like(out, fill))


def pack_tensor_dict(data: TensorDict, shift: bool = True) -> TensorDict:
    """Padded ``[B, S]`` trajectory -> packed 1-D tensors over the real tokens.

    Returns the token keys packed to ``[T, ...]`` (``T = Σ len_b``), per-sample ``[B]`` keys as
    they are, ``cu_seqlens`` (int32 ``[B + 1]``), ``max_seqlen`` (0-d int), ``position_ids``
    (``[T]``, restarting at 0 in each sequence) and, with ``shift``, ``labels`` plus every token
    key but the ``INPUT_KEYS`` in next-token alignment (see the module comment).
    """
    if "input_ids" not in data or "attention_mask" not in data:
        raise ValueError("pack_tensor_dict needs input_ids and attention_mask")
    am = data["attention_mask"]
    lens = seqlens_from_mask(am)
    keep = am.bool()
    out: TensorDict = {}
    for k, v in data.items():
        if k == "attention_mask":
            continue
        if is_token_key(data, k):
            if shift and k not in INPUT_KEYS:
                fill = False if v.dtype == torch.bool else (-1 if k == "versions" else 0)
                v = next_token_view(v, lens, fill)
            out[k] = v[keep]
        else:
            out[k] = v
    if shift:
        out["labels"] = next_token_view(data["input_ids"], lens, 0)[keep]
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32, device=am.device)
    cu[1:] = torch.cumsum(lens, 0)
    out["cu_seqlens"] = cu
    out["max_seqlen"] = lens.max() if len(lens) else torch.tensor(0)
    starts = torch.repeat_interleave(cu[:-1].long(), lens)
    out["position_ids"] = torch.arange(int(cu[-1]), device=am.device) - starts
    return out


def unpack_to_padded(
    packed: torch.Tensor, cu_seqlens: torch.Tensor, width: int, shift_back: bool = False,
    fill: float = 0.0,
) -> torch.Tensor:
    """Packed ``[T, ...]`` -> padded ``[B, width, ...]``.

    With ``shift_back`` the packed values are in next-token alignment (value ``i`` is about token
    ``i + 1``) and are moved onto the token they describe: ``out[b, t] = packed[start_b + t - 1]``
    for ``1 <= t < len_b``, and ``fill`` at ``t = 0`` and past the end.
    """
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    B = len(lens)
    out = packed.new_full((B, width, *packed.shape[1:]), fill)
    mask = torch.arange(width, device=packed.device)[None, :] < lens[:, None]
    if not shift_back:
        out[mask] = packed
        return out
    # drop each sequence's last packed value (it predicts nothing), put the rest at t >= 1
    last = cu_seqlens[1:].long() - 1
    src_keep = torch.ones(packed.shape[0], dtype=torch.bool, device=packed.device)
    src_keep[last[lens > 0]] = False
    dst = mask.clone()
    dst[:, 0] = False
    out[dst] = packed[src_keep]
    return out


def block_causal_mask(
    cu_seqlens: torch.Tensor, total: int | None = None, dtype: torch.dtype = torch.bool
) -> torch.Tensor:
    """``[1, 1, T, T]`` mask letting token i attend to j iff same sequence and j <= i.

    ``torch.bool`` gives True = attend (SDPA); a float dtype gives an additive mask (0 or the
    dtype's min) as eager attention expects. Positions past ``cu_seqlens[-1]`` (padding up to
    ``total``) attend only to themselves, so no row is fully masked.
    """
    T = int(cu_seqlens[-1]) if total is None else int(total)
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    seg = torch.repeat_interleave(torch.arange(len(lens), device=cu_seqlens.device), lens)
    if T > len(seg):
        extra = torch.arange(T - len(seg), device=seg.device) + len(lens)
        seg = torch.cat([seg, extra])
    idx = torch.arange(T, device=seg.device)
    allowed = (seg[:, None] == seg[None, :]) & (idx[None, :] <= idx[:, None])
    if dtype == torch.bool:
        return allowed[None, None]
    m = torch.zeros(T, T, dtype=dtype, device=seg.device)
    m.masked_fill_(~allowed, torch.finfo(dtype).min)
    return m[None, None]


# --------------------------------------------------------------------------- micro-batches


def ffd_allocate(sizes: Sequence[int], capacity: int, min_groups: int = 1) -> list[list[int]]:
    """First-fit-decreasing bin packing of item ``sizes`` under ``capacity``.

    Returns at least ``min_groups`` groups of item indices (each sorted ascending). An item
    larger than ``capacity`` gets a group of its own (it cannot be split). Extra groups beyond
    what FFD needs are made by splitting the group with most items (by size, alternating), and
    stay empty only when there are fewer items than ``min_groups``.
    """
    if capacity <= 0:
        raise ValueError(f"capacity must be positive, got {capacity}")
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    groups: list[list[int]] = []
    loads: list[int] = []
    for i in order:
        for g, load in enumerate(loads):
            if load + sizes[i] <= capacity:
                groups[g].append(i)
                loads[g] += sizes[i]
                break
        else:
            groups.append([i])
            loads.append(sizes[i])
    while len(groups) < min_groups:
        g = max(range(len(groups)), key=lambda j: len(groups[j])) if groups else -1
        if g < 0 or len(groups[g]) < 2:
            groups.append([])
            continue
        items = sorted(groups[g], key=lambda i: -sizes[i])
        a, b, la, lb = [], [], 0, 0
        for i in items:  # greedy halving: next item to the lighter half
            if la <= lb:
                a.append(i)
                la += sizes[i]
            else:
                b.append(i)
                lb += sizes[i]
        groups[g] = a
        groups.append(b)
    return [sorted(g) for g in groups]


def balanced_partition(sizes: Sequence[int], n: int) -> list[list[int]]:
    """Exactly ``n`` non-empty groups with balanced total size (largest item to lightest group)."""
    if n < 1 or n > len(sizes):
        raise ValueError(f"cannot split {len(sizes)} items into {n} non-empty groups")
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    groups: list[list[int]] = [[] for _ in range(n)]
    loads = [0] * n
    for k, i in enumerate(order):
        # the first n items seed one group each, so no group is left empty
        g = k if k < n else min(range(n), key=lambda j: (loads[j], j))
        groups[g].append(i)
        loads[g] += sizes[i]
    return [sorted(g) for g in groups]


def select_rows(data: TensorDict, idx: Sequence[int] | torch.Tensor) -> TensorDict:
    """Rows ``idx`` of every ``[B, ...]`` value, trimmed to the longest selected row."""
    idx_t = torch.as_tensor(list(idx) if not isinstance(idx, torch.Tensor) else idx, dtype=torch.long)
    out = {k: v[idx_t] for k, v in data.items()}
    if "attention_mask" in out and len(idx_t) > 0:
        width = int(out["attention_mask"].sum(1).max())
        token_keys = [k for k in out if is_token_key(out, k)]
        for k in token_keys:
            out[k] = out[k][:, :width]
    return out


@dataclass
class MicroBatchList:
    """Padded micro-batches of one batch plus the row indices each came from."""

    mbs: list[TensorDict]
    indices: list[list[int]]
    batch_size: int
    width: int

    def __len__(self) -> int:
        return len(self.mbs)

    def restore(self, outs: Sequence[torch.Tensor], fill: float = 0.0) -> torch.Tensor:
        """Per-micro-batch ``[b_i, s_i, ...]`` outputs -> ``[B, width, ...]`` in input order."""
        ref = next(o for o in outs if o is not None)
        res = ref.new_full((self.batch_size, self.width, *ref.shape[2:]), fill)
        for idx, o in zip(self.indices, outs):
            if idx:
                res[torch.as_tensor(idx), : o.shape[1]] = o[: len(idx)]
        return res


def dummy_row(like: TensorDict) -> TensorDict:
    """A one-token row with every mask False: a micro-batch for a rank with no data left, so
    that every rank runs the same number of forward/backward passes (FSDP collectives)."""
    out: TensorDict = {}
    for k, v in like.items():
        if is_token_key(like, k):
            out[k] = torch.zeros((1, 1, *v.shape[2:]), dtype=v.dtype, device=v.device)
        else:
            out[k] = torch.zeros((1, *v.shape[1:]), dtype=v.dtype, device=v.device)
    out["attention_mask"][:] = True
    if "versions" in out:
        out["versions"][:] = -1
    if "routed_experts" in out:  # no routing to replay: the router picks
        out["routed_experts"][:] = -1
    return out


def split_into_micro_batches(
    data: TensorDict, max_tokens_per_mb: int, min_n_mbs: int = 1, group=None,
    units: Sequence[Sequence[int]] | None = None, unit_sizes: Sequence[int] | None = None,
) -> MicroBatchList:
    """First-fit-decreasing micro-batches of at most ``max_tokens_per_mb`` real tokens.

    With ``units`` (lists of row indices, e.g. GRPO groups) whole units are allocated, each
    costing ``unit_sizes`` tokens (default: the sum of its rows' lengths), and stay together.
    With a process ``group`` (and torch.distributed initialised) every rank ends up with the
    same count (the max over ranks): collectives inside forward/backward must match.
    Micro-batches left without rows hold one dummy row (see ``dummy_row``), at index ``[]``.
    """
    lens = seqlens_from_mask(data["attention_mask"]).tolist()
    if units is None:
        units = [[i] for i in range(len(lens))]
    sizes = list(unit_sizes) if unit_sizes is not None else [sum(lens[i] for i in u) for u in units]

    def allocate(min_groups: int) -> list[list[int]]:
        bins = ffd_allocate(sizes, max_tokens_per_mb, min_groups=min_groups)
        return [sorted(i for u in b for i in units[u]) for b in bins]

    groups = allocate(max(1, min_n_mbs))
    n = len(groups)
    if group is not None:
        import torch.distributed as dist

        from arealite.utils.distributed import all_reduce

        if dist.is_available() and dist.is_initialized():
            dev = "cuda" if dist.get_backend(group) == "nccl" else "cpu"
            t = torch.tensor([n], device=dev)
            all_reduce(t, op=dist.ReduceOp.MAX, group=group)
            if int(t) > n:
                groups = allocate(int(t))
    mbs = [select_rows(data, g) if g else dummy_row(data) for g in groups]
    return MicroBatchList(mbs, groups, len(lens), data["input_ids"].shape[1])


def split_batch_for_rank(
    data: TensorDict, rank: int, world_size: int, group_size: int = 1
) -> TensorDict:
    """This rank's contiguous share of a global batch; GRPO groups are never split."""
    B = data["input_ids"].shape[0]
    if B % group_size or (B // group_size) % world_size:
        raise ValueError(
            f"batch of {B} rows (groups of {group_size}) does not split over {world_size} ranks"
        )
    per = B // world_size
    return select_rows(data, range(rank * per, (rank + 1) * per))


def packing_efficiency(mbl: MicroBatchList, mode: str = "packed", max_tokens_per_mb: int = 0) -> float:
    """Real tokens / processed tokens of a micro-batch split.

    ``packed``: what the engine runs (each micro-batch packed into one row; dummy rows count as
    processed); ``padded``: if each micro-batch ran as a padded ``[b_i, s_i]`` block instead;
    ``budget``: fill of fixed ``max_tokens_per_mb`` buffers (n_mbs × budget).
    """
    real = sum(int(mb["attention_mask"].sum()) for mb, idx in zip(mbl.mbs, mbl.indices) if idx)
    if mode == "packed":
        processed = sum(int(mb["attention_mask"].sum()) for mb in mbl.mbs)
    elif mode == "padded":
        processed = sum(int(mb["attention_mask"].numel()) for mb in mbl.mbs)
    elif mode == "budget":
        if max_tokens_per_mb <= 0:
            raise ValueError("mode='budget' needs max_tokens_per_mb > 0")
        processed = len(mbl) * max_tokens_per_mb
    else:
        raise ValueError(f"mode must be packed, padded or budget, not {mode!r}")
    return real / max(1, processed)
