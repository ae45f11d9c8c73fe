"""Prefill shared tokens once: the engine's prefill when new rows are identical or share a prefix.

A GRPO group arrives as ``n`` sequences with the same prompt (one batched ``/generate``), and
they are admitted in the same step. Their keys and values are the same, so the forward runs over
the distinct feeds only and each duplicate row gets a copy of its twin's KV rows. On the CPU
the prefill's cost is in its tokens, so a group of 8 costs about one prompt's forward instead
of 8 (benchmarks/studies/vs_trl.py's rollout phase). Rows with images never share (their embeddings
are per row); rows share only with rows of the same LoRA adapter.

Distinct prompts admitted together often start alike: a held-out evaluation sends every prompt
at once, each behind the same system prompt and chat template (the real-model job's 200: 38 of
77 tokens on average). When the distinct feeds share at least ``MIN_SHARED`` leading tokens,
that prefix runs once in one row, its KV rows are copied to the others, and the rest of every
feed runs from there (a causal model's keys and values on a prefix do not depend on what
follows it). Not with expert-routing capture on: its record is one forward's.
"""

from __future__ import annotations

from typing import Any

import torch

MIN_SHARED = 16  # leading tokens worth a second forward (its fixed cost is the layers' calls)


def shared_prefix_len(feeds: list[list[int]]) -> int:
    """The longest prefix all ``feeds`` (two or more) share, short of the shortest feed's last
    token (every row's last position must run: it is what the next token is sampled from)."""
    if len(feeds) < 2:
        return 0
    first, n = feeds[0], min(len(f) for f in feeds) - 1
    for f in feeds[1:]:
        k = 0
        while k < n and f[k] == first[k]:
            k += 1
        n = k
    return max(n, 0)


def prefill_distinct(runner: Any, r0: int, seqs: list[Any],
                     feeds: list[list[int]]) -> tuple[torch.Tensor, list[int]]:
    """Prefill rows ``[r0, r0 + len(seqs))`` with ``feeds`` (the tokens not yet cached).

    Returns the hidden states ``[U, T, H]`` of the distinct feeds and, per row, the index of
    its feed among them. The KV cache ends as if every row had been run.
    """
    first: dict[tuple, int] = {}
    pick: list[int] = []
    distinct: list[int] = []  # row index of each distinct feed, in order of first appearance
    for b, (s, f) in enumerate(zip(seqs, feeds)):
        key = None if s.vision is not None else (s.lora, *f)
        u = first.get(key) if key is not None else None
        if u is None:
            u = len(distinct)
            distinct.append(b)
            if key is not None:
                first[key] = u
        pick.append(u)
    t = max(len(feeds[b]) for b in distinct)
    tokens = torch.tensor([feeds[b] + [0] * (t - len(feeds[b])) for b in distinct],
                          device=runner.device)
    starts = torch.zeros(len(distinct), dtype=torch.long, device=runner.device)
    vision = [seqs[b].vision for b in distinct]
    loras = [seqs[b].lora for b in distinct]
    runner.cache.ensure(r0 + len(seqs), t)  # every row at once: the forward only needs U
    p = shared_prefix_len([feeds[b] for b in distinct])
    if (p >= MIN_SHARED and all(v is None for v in vision) and len(set(loras)) == 1
            and runner.routed is None):
        # the prefix once, in row r0; its KV to the other distinct rows; then every suffix
        u = len(distinct)
        head = runner.forward(r0, tokens[:1, :p], starts[:1], None, loras[:1])
        runner.cache.copy_rows([r0] * (u - 1), list(range(r0 + 1, r0 + u)), p)
        tail = runner.forward(r0, tokens[:, p:], starts + p, None, loras)
        hid = torch.cat([head.expand(u, -1, -1), tail], dim=1)
    else:
        hid = runner.forward(r0, tokens, starts,
                             vision if any(v is not None for v in vision) else None, loras)
    if len(distinct) < len(seqs):
        # Row r0 + u now holds distinct feed u. Positions past a row's own feed are padding
        # (hidden by the mask, overwritten later), so one copy of t positions serves every row.
        dup = [b for b in range(len(seqs)) if pick[b] != b]
        runner.cache.copy_rows([r0 + pick[b] for b in dup], [r0 + b for b in dup], t)
    return hid, pick
