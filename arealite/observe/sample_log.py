"""Which samples each step trained on: ``{run}/logs/sample_ids.jsonl``, one line per step,
``{"step": s, "ids": [...]}`` (the ``sample_ids`` of every trained sequence, all ranks, rank 0
writes). It is the evidence that a recovered run trains the same data as an uninterrupted one
and no sample twice; on resume, lines of steps after the checkpoint are dropped (they run
again), as ``StatsLogger(start_step=...)`` does for metrics."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

FILE_NAME = "sample_ids.jsonl"


class SampleIdLog:
    def __init__(self, log_dir: str | os.PathLike, start_step: int | None = None, rank: int = 0):
        """``start_step``: the last step kept from an earlier run (None: a fresh log)."""
        self.path = Path(log_dir) / FILE_NAME
        self.rank = rank
        if rank != 0:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = []
        if start_step is not None and self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    if json.loads(line)["step"] <= start_step:
                        kept.append(line)
                except (ValueError, KeyError, TypeError):
                    break  # a line cut by the crash: nothing after it is valid
        self.path.write_text("".join(line + "\n" for line in kept))

    def record(self, step: int, sample_ids: torch.Tensor | None) -> list[int]:
        """Collective when distributed: every rank passes its batch's ``sample_ids`` (or None
        when the workflow gives none); returns (on rank 0) the ids of the whole step."""
        ids = [] if sample_ids is None else [int(x) for x in sample_ids.reshape(-1).tolist()]
        if dist.is_initialized() and dist.get_world_size() > 1:
            parts: list[list[int] | None] = [None] * dist.get_world_size()
            dist.all_gather_object(parts, ids)
            ids = [i for p in parts for i in (p or [])]
        if self.rank == 0:
            with open(self.path, "a") as f:
                f.write(json.dumps({"step": step, "ids": ids}) + "\n")
        return ids


def read_sample_ids(path: str | os.PathLike) -> dict[int, list[int]]:
    """``{step: ids}`` from a log written by ``SampleIdLog``."""
    out = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            out[row["step"]] = row["ids"]
    return out
