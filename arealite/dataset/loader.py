"""Dataset rows from local JSON/JSONL/CSV files or HF ``datasets``, served by torchdata's
``StatefulDataLoader`` so a recovered run resumes mid-epoch in the same order."""

from __future__ import annotations

import csv
import json
import warnings
from pathlib import Path
from typing import Any

from arealite.api.config.dataset import DatasetConfig


def local_file(config: DatasetConfig) -> Path | None:
    """The local file the split is read from (it may not exist), or None for a hub data set."""
    if not config.path:
        raise ValueError("dataset path is empty")
    p = Path(config.path)
    if p.is_dir():
        p = next((p / f"{config.split}.{e}" for e in ("jsonl", "json", "csv")
                  if (p / f"{config.split}.{e}").is_file()), p / f"{config.split}.jsonl")
    return p if p.suffix in (".jsonl", ".json", ".csv") else None


def load_rows(config: DatasetConfig) -> list[dict[str, Any]]:
    """All rows of the configured split as plain dicts (an ``id`` is added when missing)."""
    p = local_file(config)
    if p is not None:
        if not p.is_file():
            raise FileNotFoundError(f"dataset file not found: {p}")
        rows = _read_local(p)
    else:
        rows = _read_hf(config)
    if config.max_length is not None:
        rows = [r for r in rows if len(str(r.get("question", r.get("prompt", "")))) <= config.max_length]
    for i, r in enumerate(rows):
        r.setdefault("id", i)
    return rows


def _read_local(p: Path) -> list[dict[str, Any]]:
    text = p.read_text()
    if p.suffix == ".jsonl":
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:  # file:line, as an editor jumps to it
                raise ValueError(f"{p}:{n}: not valid JSON ({e.msg}, column {e.colno})") from None
            if not isinstance(rows[-1], dict):
                raise ValueError(f"{p}:{n}: a row must be a JSON object, got "
                                 f"{type(rows[-1]).__name__}")
    elif p.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{p}:{e.lineno}: not valid JSON ({e.msg}, column {e.colno})") from None
        rows = data if isinstance(data, list) else data.get("data", [])
    else:
        rows = list(csv.DictReader(text.splitlines()))
    if not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"{p}: every row must be an object")
    return rows


def _read_hf(config: DatasetConfig) -> list[dict[str, Any]]:
    try:
        import datasets  # optional: only where a hub (or a local HF cache) is reachable
    except ImportError as e:
        raise ValueError(
            f"'{config.path}' is not a local .json/.jsonl/.csv file and `datasets` is not "
            "installed to load it from a hub: pip install 'arealite[datasets]'"
        ) from e
    ds = datasets.load_dataset(config.path, config.name, split=config.split)
    return [dict(r) for r in ds]


def _collate(batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return batch


def create_dataloader(
    rows: list[dict[str, Any]],
    config: DatasetConfig,
    seed: int = 0,
    rank: int = 0,
    world_size: int = 1,
):
    """A ``StatefulDataLoader`` yielding lists of row dicts, sharded over data-parallel ranks.

    ``config.batch_size`` is the global batch; each rank gets ``batch_size // world_size``.
    """
    import torch
    from torch.utils.data.distributed import DistributedSampler
    from torchdata.stateful_dataloader import StatefulDataLoader

    if config.batch_size % world_size:
        raise ValueError(f"batch_size {config.batch_size} not divisible by {world_size} ranks")
    sampler = DistributedSampler(
        rows, num_replicas=world_size, rank=rank, shuffle=config.shuffle, seed=seed,
        drop_last=config.drop_last,
    )
    with warnings.catch_warnings():
        # torchdata 0.11's constructor calls torch.set_vital, a no-op that torch 2.13 warns about:
        # a warning in every trainer's log about torchdata's code, not ours or the user's
        warnings.filterwarnings("ignore", message="'set_vital' is deprecated", category=UserWarning)
        return StatefulDataLoader(
            rows,
            batch_size=config.batch_size // world_size,
            sampler=sampler,
            num_workers=config.num_workers,
            collate_fn=_collate,
            drop_last=config.drop_last,
            generator=torch.Generator().manual_seed(seed),
        )
