"""A request's routed experts across its segments (``gconfig.return_routed_experts``).

Each ``/generate`` answer of a mixture-of-experts server reports the experts of every token it
fed to a forward, from ``routed_experts_start_len`` on (SGLang's ``meta_info.routed_experts``).
A request cut by a pause is resumed with prompt + tokens so far: its next segment asks only for
the rows past those already held, and the parts join (``arealite.api.trajectory``), so each
generated token keeps the routing it was sampled with even when a weight update fell between.
"""

from __future__ import annotations

import numpy as np

from arealite.api.trajectory import RoutedExpertsError, join_routed_experts
from arealite.backends.base import Segment


def join_segment(
    known: np.ndarray | None, seg: Segment, n_input: int, width: int | None
) -> np.ndarray | None:
    """``known`` rows joined with the rows of ``seg`` (sent ``n_input`` tokens); ``width``: the
    ids per token the trainer expects (layers x top_k), None to take the server's."""
    flat = seg.routed_experts
    if flat is None:
        return known
    rows = n_input + len(seg.output_ids) - 1 - seg.routed_start
    if rows <= 0 or flat.size % rows:
        raise RoutedExpertsError(
            f"{flat.size} routed expert ids for {max(rows, 0)} tokens: not a whole number per token"
        )
    w = flat.size // rows
    if width is not None and w != width:
        raise RoutedExpertsError(
            f"{w} routed expert ids per token, expected {width} (the "
            "trainer's MoE layers x top_k): another model, or layers missing"
        )
    return join_routed_experts(known, flat.reshape(rows, w), seg.routed_start)


def check_complete(rows: np.ndarray | None, n_tokens: int, rid: str) -> np.ndarray:
    """The request's rows, which must cover every token but the last."""
    have = 0 if rows is None else len(rows)
    if have != n_tokens - 1:
        raise RoutedExpertsError(
            f"request {rid}: the servers reported routed experts for {have} "
            f"tokens, expected {n_tokens - 1} (prompt + output - 1); launch "
            "them with --enable-return-routed-experts"
        )
    return rows
