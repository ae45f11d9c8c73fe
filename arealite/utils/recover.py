"""Recovery checkpoints: the trainer's bookkeeping (``RecoverInfo``) beside the engine's DCP
weights and optimizer, made complete atomically.

Layout under ``{cluster.fileroot}/{experiment_name}/{trial_name}/recover/``::

    step00000020/                  a complete checkpoint (renamed into place as a whole)
        weights/                   engine.save(SaveLoadMeta(path, weight_format="dcp", with_optim=True))
        recover_info.pkl           RecoverInfo (pickle: dataloader state may hold tensors)
        checkpoint_complete.json   marker: {"step", "version", "epoch", "time"}
    .tmp-step00000030/             a save in progress, or one cut by a crash: never loaded

A checkpoint is written into a temporary directory and renamed only after every rank has
finished writing and the marker is on disk, so a crash mid-save leaves at worst a ``.tmp-``
directory that ``find_latest`` ignores and the next save removes. Saving a step that already
has a checkpoint moves the old one aside as ``.old-stepN`` first; a crash between the two renames
leaves that complete copy, which ``list_checkpoints`` still finds (so an interrupted save never
takes the last good checkpoint away), and the next save removes it.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

MARKER = "checkpoint_complete.json"
INFO_FILE = "recover_info.pkl"
WEIGHTS_DIR = "weights"
FORMAT_VERSION = 1
_NAME = re.compile(r"^(?:\.old-)?step(\d+)$")  # a complete checkpoint, or one moved aside


@dataclass
class RecoverInfo:
    """Everything besides weights and optimizer that a resumed run needs to continue exactly.

    ``step`` is the last *finished* global step (the resumed run starts at ``step + 1``);
    ``epoch``/``epoch_step`` locate it in the data; ``version`` is the weight version after it.
    """

    step: int
    epoch: int
    epoch_step: int
    version: int
    dataloader_state: dict[str, Any] = field(default_factory=dict)
    staleness_state: dict[str, Any] = field(default_factory=dict)
    saver_state: dict[str, Any] = field(default_factory=dict)
    evaluator_state: dict[str, Any] = field(default_factory=dict)
    checkpointer_state: dict[str, Any] = field(default_factory=dict)
    stats_logger_step: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("step", "epoch", "epoch_step", "version"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"RecoverInfo.{name} must be a non-negative int, got {v!r}")


def recover_root(config: Any) -> Path:
    """``{fileroot}/{experiment_name}/{trial_name}/recover`` for an experiment config."""
    return config.run_dir("recover")


def weights_dir(ckpt_dir: str | os.PathLike) -> Path:
    """Where the engine's DCP weights and optimizer live inside a checkpoint directory."""
    return Path(ckpt_dir) / WEIGHTS_DIR


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems do not support fsync on directories
    finally:
        os.close(fd)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _default_barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _default_rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def save_checkpoint(
    root: str | os.PathLike,
    info: RecoverInfo,
    save_weights: Callable[[Path], None] | None = None,
    *,
    keep: int = 1,
    rank: int | None = None,
    barrier: Callable[[], None] | None = None,
) -> Path:
    """Write a complete checkpoint for ``info.step``; collective when distributed.

    Every rank calls this; ``save_weights(dir)`` runs on every rank (DCP save is collective) into
    the temporary directory. Rank 0 then writes ``RecoverInfo`` and the marker, renames the
    directory into place and prunes all but the newest ``keep`` checkpoints. Returns the final
    directory."""
    if keep < 1:
        raise ValueError("keep must be >= 1")
    root = Path(root)
    rank = _default_rank() if rank is None else rank
    barrier = barrier or _default_barrier
    name = f"step{info.step:08d}"
    tmp, final = root / f".tmp-{name}", root / name
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    barrier()
    if save_weights is not None:
        save_weights(weights_dir(tmp))
    barrier()
    if rank == 0:
        _write_atomic(tmp / INFO_FILE, pickle.dumps(
            {"format_version": FORMAT_VERSION, **asdict(info)}, protocol=pickle.HIGHEST_PROTOCOL))
        marker = {"step": info.step, "epoch": info.epoch, "version": info.version,
                  "time": time.time()}
        _write_atomic(tmp / MARKER, json.dumps(marker).encode())
        _fsync_dir(tmp)
        if final.exists():  # the same step saved again after a recovery: replace it
            old = root / f".old-{name}"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync_dir(root)
        _prune(root, keep)
    barrier()
    return final


def _prune(root: Path, keep: int) -> None:
    complete = list_checkpoints(root)
    for d in complete[:-keep]:
        shutil.rmtree(d, ignore_errors=True)
    for d in [*root.glob(".tmp-step*"), *root.glob(".old-step*")]:  # left by an earlier crash
        if d not in complete[-keep:]:
            shutil.rmtree(d, ignore_errors=True)


def is_complete(ckpt_dir: str | os.PathLike) -> bool:
    d = Path(ckpt_dir)
    return bool(_NAME.match(d.name)) and (d / MARKER).is_file() and (d / INFO_FILE).is_file()


def list_checkpoints(root: str | os.PathLike) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first (a step's ``.old-`` copy only where a
    crash left no ``stepN`` beside it)."""
    root = Path(root)
    if not root.is_dir():
        return []
    by_step: dict[int, Path] = {}
    for d in root.iterdir():
        if d.is_dir() and is_complete(d):
            step = int(_NAME.match(d.name).group(1))
            if step not in by_step or not d.name.startswith("."):
                by_step[step] = d
    return [by_step[s] for s in sorted(by_step)]


def find_latest(root: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint under ``root``, or None."""
    ckpts = list_checkpoints(root)
    return ckpts[-1] if ckpts else None


def load_recover_info(ckpt_dir: str | os.PathLike) -> RecoverInfo:
    """Read the ``RecoverInfo`` of a complete checkpoint (our own file: pickle is trusted)."""
    d = Path(ckpt_dir)
    if not is_complete(d):
        raise FileNotFoundError(f"{d} is not a complete recovery checkpoint (no {MARKER})")
    with open(d / INFO_FILE, "rb") as f:
        data = pickle.load(f)
    if not isinstance(data, dict) or data.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{d / INFO_FILE}: unknown recover-info format")
    names = {f.name for f in fields(RecoverInfo)}
    return RecoverInfo(**{k: v for k, v in data.items() if k in names})


def should_recover(config: Any) -> bool:
    """Whether a run with this config resumes from a recovery checkpoint.

    ``recover.mode``: ``disabled`` never; ``auto`` when a complete checkpoint exists;
    ``resume`` always, and it is an error when there is none."""
    mode = config.recover.mode
    if mode == "disabled":
        return False
    latest = find_latest(recover_root(config))
    if mode == "resume" and latest is None:
        raise FileNotFoundError(
            f"recover.mode=resume but no complete checkpoint under {recover_root(config)}")
    return latest is not None
