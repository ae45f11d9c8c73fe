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
    rollout_batch: Callable[[list[Any], Callable[[TensorDict], bool]], TensorDict],
    next_rows: Callable[[], list[Any]],
    keep: GroupRewardFilter,
    n_groups: int,
    group_size: int,
    max_draws: int = 16,
) -> TensorDict:
    """Synchronous dynamic sampling: run ``rollout_batch(rows, accept)`` on rows from
    ``next_rows()`` until ``n_groups`` episodes (one group of ``group_size`` rows each) pass
    ``keep``; returns exactly ``n_groups`` groups. ``accept`` goes to the executor as
    ``should_accept``, so a group it turns down gives back its place in the staleness budget,
    and each draw asks only for the groups still missing: counted as accepted, or drawn a whole
    batch at a time, the extra draws used up the versions ahead and a draw waited for a version
    that never came. Rows drawn from ``next_rows()`` beyond the last draw are not used. Raises after ``max_draws`` draws,
    naming how many passed (a task the policy always or never solves would otherwise loop)."""
    taken = 0

    def accept(traj: TensorDict) -> bool:
        nonlocal taken
        if taken >= n_groups or not keep(traj):  # a surplus group is not counted as dropped
            return False
        taken += 1
        return True

    parts: list[TensorDict] = []
    rows: list[Any] = []
    for _ in range(max_draws):
        # a draw is as large as what is missing: that is exactly the staleness budget left
        # (B per version, minus the groups kept), so no episode of it waits for a version
        while len(rows) < n_groups - taken:
            rows += next_rows()
        draw, rows = rows[:n_groups - taken], rows[n_groups - taken:]
        batch = rollout_batch(draw, accept)
        if batch:  # empty when every episode of the draw was turned down
            parts.append(batch)
        if taken >= n_groups:
            out = concat_padded_tensors(parts)
            rows = out["rewards"].shape[0]
            if rows != n_groups * group_size:
                raise ValueError(f"dynamic sampling: {rows} rows for {n_groups} groups of "
                                 f"{group_size}; each episode must return one whole group")
            return out
    raise RuntimeError(f"dynamic sampling: {taken}/{n_groups} groups with differing rewards "
                       f"after {max_draws} draws; the task is all-solved or all-failed")
