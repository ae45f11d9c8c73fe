"""Shared-prompt packing: the rows of a GRPO group share their prompt, so a packed micro-batch
stores the group's common prefix once and every completion attends to it (a prefix-tree mask,
``arealite.engine.segment_attention``).

A causal LM's hidden states on a prefix do not depend on what follows it, so the logits at the
shared positions are those each row would get on its own; ``expand_index`` maps every position
of the ordinary packed layout (``pack_tensor_dict``) to the shared position computing it, and
the loss reads ``logits_shared[expand_index]``. The losses are therefore those of the unshared
computation, and autograd sums the gradients of the rows that share a position into it, which is
what the unshared computation's gradient is too (``tests/engine/test_segment_attention.py``).

The prefix of a group is the longest common prefix of its rows (the prompt, and more when
completions start alike, or all of it when they are identical).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from arealite.engine.segment_attention import SegmentLayout, build_layout


def group_units(n_rows: int, group_size: int) -> list[list[int]]:
    """Consecutive rows in groups of ``group_size`` (the last group may be shorter)."""
    g = max(1, group_size)
    return [list(range(i, min(n_rows, i + g))) for i in range(0, n_rows, g)]


def common_prefix_len(input_ids: torch.Tensor, lens: torch.Tensor) -> int:
    """Longest common prefix of the rows of a right-padded ``[k, S]`` block (real tokens only)."""
    if input_ids.shape[0] < 2:
        return 0
    m = int(lens.min())
    same = (input_ids[:, :m] == input_ids[:1, :m]).all(0)
    diff = torch.nonzero(~same)
    return int(diff[0]) if len(diff) else m


def shared_sizes(input_ids: torch.Tensor, lens: torch.Tensor,
                 units: Sequence[Sequence[int]]) -> list[int]:
    """Tokens each unit takes once its common prefix is stored once."""
    out = []
    for u in units:
        idx = torch.as_tensor(list(u))
        p = common_prefix_len(input_ids[idx], lens[idx])
        out.append(int(lens[idx].sum()) - p * (len(u) - 1))
    return out


def share_prefixes(
    input_ids: torch.Tensor, lens: torch.Tensor, unit_of_row: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, SegmentLayout]:
    """Shared packing of one padded micro-batch ``input_ids [n, S]`` (real lengths ``lens``),
    whose rows of equal ``unit_of_row`` are consecutive and share their common prefix.

    Returns ``(ids [T'], position_ids [T'], expand_index [T], layout)`` where ``T = Σ lens`` is
    the ordinary packed length and ``T'`` the shared one.
    """
    dev = input_ids.device
    ids, lens = input_ids.cpu(), lens.cpu().long()
    n = len(lens)
    units = torch.as_tensor(list(unit_of_row), dtype=torch.long)
    first = torch.ones(n, dtype=torch.bool)
    first[1:] = units[1:] != units[:-1]
    first_row = torch.cummax(torch.where(first, torch.arange(n), 0), 0).values
    prefix = torch.zeros(n, dtype=torch.long)
    starts = torch.nonzero(first).squeeze(-1).tolist() + [n]
    for a, b in zip(starts[:-1], starts[1:]):
        prefix[a:b] = common_prefix_len(ids[a:b], lens[a:b])
    cu = torch.zeros(n + 1, dtype=torch.long)
    cu[1:] = torch.cumsum(lens, 0)
    T = int(cu[-1])
    row = torch.repeat_interleave(torch.arange(n), lens)
    t = torch.arange(T) - cu[:-1][row]
    keep = first[row] | (t >= prefix[row])
    rank = torch.cumsum(keep.long(), 0) - 1
    src = torch.where(keep, torch.arange(T), cu[:-1][first_row[row]] + t)
    expand = rank[src]
    packed_ids = ids[torch.arange(ids.shape[1])[None] < lens[:, None]]
    shared_ids = packed_ids[keep]
    shared_pos = t[keep]
    # the first row of a unit stores the prefix and its own tokens as one run and queries all
    # of it (prefix span empty); another row reads the first row's prefix, then its own tokens
    row_prefix = torch.where(first, 0, prefix)
    own_len = lens - row_prefix
    own_start = rank[(cu[:-1] + row_prefix).clamp(max=max(T - 1, 0))]
    prefix_start = rank[cu[:-1][first_row]]
    layout = build_layout(prefix_start, row_prefix, own_start, own_len, first, len(shared_ids))
    return shared_ids.to(dev), shared_pos.to(dev), expand.to(dev), layout.to(dev)
