"""DAPO's dynamic sampling: drop groups whose rewards are all equal (their group-relative
advantages are 0, so they only dilute the batch) and keep drawing until the batch is full.

Asynchronous training passes a ``GroupRewardFilter`` as ``prepare_batch``'s ``should_accept``:
the executor already keeps collecting until ``consumer_batch_size`` episodes pass it.
Synchronous training uses ``rollout_full_batch``, which draws further prompts until enough
groups pass. Either way the filter counts what it kept and dropped (``stats()``, logged each
step as ``dynamic_sampling/*``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from arealite.api.trajectory import TensorDict, concat_padded_tensors


class GroupRewardFilter:
    """``should_accept`` hook: True when the trajectory's rewards (one group) differ by more
    than ``tol``."""

    def __init__(self, tol: float = 0.0):
        self.tol = tol
        self._lock = threading.Lock()
        self.kept = 0
        self.dropped = 0

    def __call__(self, traj: TensorDict) -> bool:
        r = traj["rewards"].float()
        ok = r.numel() > 0 and float(r.max() - r.min()) > self.tol
        with self._lock:
            if ok:
                self.kept += 1
            else:
                self.dropped += 1
        return ok

    def stats(self, reset: bool = True) -> dict[str, float]:
        """Groups kept and dropped since the last reset, and the dropped share."""
        with self._lock:
            kept, dropped = self.kept, self.dropped
            if reset:
                self.kept = self.dropped = 0
        total = kept + dropped
        return {"dynamic_sampling/kept_groups": float(kept),
                "dynamic_sampling/dropped_groups": float(dropped),
                "dynamic_sampling/drop_ratio": dropped / total if total else 0.0}


def rollout_full_batch(
    rollout_batch: Callable[[list[Any]], TensorDict],
    next_rows: Callable[[], list[Any]],
    keep: GroupRewardFilter,
    n_groups: int,
    group_size: int,
    max_draws: int = 16,
) -> TensorDict:
    """Synchronous dynamic sampling: run ``rollout_batch(next_rows())`` until ``n_groups``
    groups of ``group_size`` consecutive rows pass ``keep``; returns exactly ``n_groups``
    groups. Raises after ``max_draws`` draws, naming how many passed (a task the policy always
    or never solves would otherwise loop forever)."""
    kept: list[TensorDict] = []
    for _ in range(max_draws):
        batch = rollout_batch(next_rows())
        rows = batch["rewards"].shape[0]
        if rows % group_size:
            raise ValueError(f"rollout of {rows} rows is not whole groups of {group_size}")
        for s in range(0, rows, group_size):
            group = {k: v[s : s + group_size] for k, v in batch.items()}
            if keep(group):
                kept.append(group)
        if len(kept) >= n_groups:
            return concat_padded_tensors(kept[:n_groups])
    raise RuntimeError(f"dynamic sampling: {len(kept)}/{n_groups} groups with differing rewards "
                       f"after {max_draws} draws; the task is all-solved or all-failed")
