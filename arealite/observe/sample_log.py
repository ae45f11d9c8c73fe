"""The run's ledger: which samples each step trained, ``{run}/logs/sample_ids.jsonl``, one line
per step (all ranks, rank 0 writes), written with the step's metrics and before its recovery
checkpoint::

    {"step": s, "ids": [...], "episodes": [...], "epochs": [...], "version": v,
     "staleness_max": k, "drops": [{"id", "epoch", "reason", "attempts"}, ...]}

``ids`` are the ``sample_ids`` of every trained sequence; ``episodes`` and ``epochs`` (same
length) the episode serial and the row's epoch the rollout executor stamped on each
(``arealite.api.trajectory``; with several ranks an episode is ``serial · world + rank``);
``drops`` the rows given up on since the previous line, with the reason (``failed`` or
``stale``). At the end of a run, ``sample_ids_end.json`` lists the rows still in flight
(``[[id, epoch], ...]``): drawn, never trained, never dropped.

It is the evidence that a recovered run trains the same data as an uninterrupted one, every
row of an epoch once and no episode twice (``benchmarks/studies/exactly_once.py`` checks it);
on resume, lines of steps after the checkpoint are dropped (they run again), as
``StatsLogger(start_step=...)`` does for metrics.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from arealite.api.trajectory import DATA_EPOCHS_KEY, EPISODE_IDS_KEY

FILE_NAME = "sample_ids.jsonl"
END_FILE_NAME = "sample_ids_end.json"


def _ints(t: torch.Tensor | None) -> list[int]:
    return [] if t is None else [int(x) for x in t.reshape(-1).tolist()]


def _gather(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order (collective when distributed)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        parts: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(parts, obj)
        return parts
    return [obj]


class SampleIdLog:
    def __init__(self, log_dir: str | os.PathLike, start_step: int | None = None, rank: int = 0):
        """``start_step``: the last step kept from an earlier run (None: a fresh log)."""
        self.path = Path(log_dir) / FILE_NAME
        self.end_path = Path(log_dir) / END_FILE_NAME
        self.rank = rank
        if rank != 0:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.end_path.unlink(missing_ok=True)  # a resumed run writes its own end
        kept = []
        if start_step is not None and self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    if json.loads(line)["step"] <= start_step:
                        kept.append(line)
                except (ValueError, KeyError, TypeError):
                    break  # a line cut by the crash: nothing after it is valid
        self.path.write_text("".join(line + "\n" for line in kept))

    def record(self, step: int, sample_ids: torch.Tensor | None,
               batch: dict[str, Any] | None = None, drops: list[dict[str, Any]] | None = None,
               version: int | None = None, epoch: int | None = None) -> list[int]:
        """Collective when distributed: every rank passes its batch's ``sample_ids`` (or None
        when the workflow gives none), and optionally the whole ``batch`` (its episode serials
        and epochs), the rows it dropped since the last step and the weight version after the
        step; ``epoch`` stands for rows stamped -1 (a synchronous run's draws). Returns (on
        rank 0) the ids of the whole step."""
        batch = batch or {}
        epochs = _ints(batch.get(DATA_EPOCHS_KEY))
        if epoch is not None:
            epochs = [epoch if e < 0 else e for e in epochs]
        mine = {"ids": _ints(sample_ids), "episodes": _ints(batch.get(EPISODE_IDS_KEY)),
                "epochs": epochs, "drops": list(drops or []), "staleness_max": _staleness(batch, version)}
        parts = _gather(mine)
        world = len(parts)
        if self.rank != 0:
            return []
        line: dict[str, Any] = {"step": step, "ids": [i for p in parts for i in p["ids"]]}
        if batch:
            line["episodes"] = [e * world + r for r, p in enumerate(parts) for e in p["episodes"]]
            line["epochs"] = [e for p in parts for e in p["epochs"]]
            line["drops"] = [d for p in parts for d in p["drops"]]
            stale = [p["staleness_max"] for p in parts if p["staleness_max"] is not None]
            line["staleness_max"] = max(stale) if stale else None
        if version is not None:
            line["version"] = version
        with open(self.path, "a") as f:
            f.write(json.dumps(line) + "\n")
        return line["ids"]

    def record_end(self, inflight: list[tuple[Any, int]]) -> None:
        """At the end of the run: the rows still in flight, as ``(row, epoch)`` (collective)."""
        mine = [[r.get("id") if isinstance(r, dict) else None, e] for r, e in inflight]
        parts = _gather(mine)
        if self.rank == 0:
            self.end_path.write_text(json.dumps([x for p in parts for x in p]))


def _staleness(batch: dict[str, Any], version: int | None) -> int | None:
    """Versions between the weights trained at this step (``version - 1``) and the oldest
    generated token of the batch."""
    v, lm = batch.get("versions"), batch.get("loss_mask")
    if version is None or v is None or lm is None or not lm.bool().any():
        return None
    return int((version - 1) - v[lm.bool()].min().item())


def read_sample_ids(path: str | os.PathLike) -> dict[int, list[int]]:
    """``{step: ids}`` from a log written by ``SampleIdLog``."""
    return {step: row["ids"] for step, row in read_ledger(path).items()}


def read_ledger(path: str | os.PathLike) -> dict[int, dict[str, Any]]:
    """``{step: line}`` from a log written by ``SampleIdLog``."""
    out = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            out[row["step"]] = row
    return out
