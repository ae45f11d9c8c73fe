"""Prefill each distinct prompt once: the engine's prefill when several new rows are identical.

A GRPO group arrives as ``n`` sequences with the same prompt (one batched ``/generate``), and
they are admitted in the same step. Their keys and values are the same, so the forward runs over
the distinct feeds only and each duplicate row gets a copy of its twin's KV rows. On the CPU
the prefill's cost is in its tokens, so a group of 8 costs about one prompt's forward instead
of 8 (benchmarks/studies/vs_trl.py's rollout phase). Rows with images never share (their embeddings
are per row); rows share only with rows of the same LoRA adapter.
"""

from __future__ import annotations

from typing import Any

import torch


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
    runner.cache.ensure(r0 + len(seqs), t)  # every row at once: the forward only needs U
    hid = runner.forward(r0, tokens, starts, vision if any(v is not None for v in vision) else None,
                         [seqs[b].lora for b in distinct])
    if len(distinct) < len(seqs):
        # Row r0 + u now holds distinct feed u. Positions past a row's own feed are padding
        # (hidden by the mask, overwritten later), so one copy of t positions serves every row.
        dup = [b for b in range(len(seqs)) if pick[b] != b]
        runner.cache.copy_rows([r0 + pick[b] for b in dup], [r0 + b for b in dup], t)
    return hid, pick
