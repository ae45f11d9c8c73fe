"""Small pieces every entry script needs: config from argv, run folders, rank info, tokenizer,
and the weight push of the RL scripts."""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist

from arealite.api.config import BaseExperimentConfig, WeightUpdateConfig
from arealite.api.config_loader import ConfigError, load_config
from arealite.api.engine_api import InferenceEngine, TrainEngine
from arealite.api.io_struct import WeightUpdateMeta


def config_from_argv(argv: list[str] | None, cls: type[BaseExperimentConfig]) -> Any:
    """``CONFIG.yaml key=value ...`` -> a validated config; a config error exits with status 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    path = argv.pop(0) if argv and "=" not in argv[0] else None
    try:
        return load_config(path, argv, cls)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def dist_info() -> tuple[int, int]:
    """(rank, world size) from torchrun's environment; (0, 1) when run directly."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def setup_logging(rank: int) -> None:
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"%(asctime)s [r{rank}] %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    for noisy in ("httpx", "urllib3", "transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def weight_meta(
    wu: WeightUpdateConfig, version: int, disk_root: Path, master_port: int, actor: TrainEngine
) -> WeightUpdateMeta:
    """The update to ``version``: a disk folder per version, or the run's one broadcast group;
    verified (``weight_update.verify``) in ``checksum_dtype``."""
    if wu.type == "disk":
        meta = WeightUpdateMeta.disk(version, disk_root)
    else:
        meta = WeightUpdateMeta.broadcast(
            version, actor.get_param_specs(wu.bucket_size_mb), master_port, wu.master_address,
            wu.group_name, wu.bucket_size_mb, wu.timeout,
        )
    meta.verify, meta.checksum_dtype = wu.verify, wu.checksum_dtype
    return meta


def push_weights(
    actor: TrainEngine, rollout: InferenceEngine, meta: WeightUpdateMeta, rank: int, timeout: float
) -> None:
    """Servers to ``meta.version``: rank 0's client drives them while every rank uploads (all
    gather; rank 0 writes or broadcasts); then every rank moves its version clock."""
    fut = rollout.update_weights(meta) if rank == 0 else None
    actor.upload_weights(meta)
    resync: list[str] = []
    if fut is not None:
        fut.result(timeout=timeout)
        resync = list(getattr(rollout.last_weight_update, "resync", None) or [])
    if dist.is_initialized():  # every rank joins a re-send's gathers
        box = [resync]
        dist.broadcast_object_list(box, src=0)
        resync = box[0]
    if resync:
        # A server's checksums differed after the broadcast: send it the weights once more,
        # alone (a new group over just it); a second mismatch raises and stops the run.
        again = dataclasses.replace(meta, world_size=None, checksums=None)
        fut = rollout.resync_weights(again, resync) if rank == 0 else None
        actor.upload_weights(again)
        if fut is not None:
            fut.result(timeout=timeout)
    if dist.is_initialized():
        dist.barrier()
    rollout.set_version(meta.version)  # the rank's one clock, shared with the actor


def rank0_decides(flag: bool) -> bool:
    """Rank 0's ``flag`` on every rank: decisions from a clock (time budget, eval every N
    seconds) must agree, or ranks part ways at the next collective and hang."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return flag
    box = [flag]
    dist.broadcast_object_list(box, src=0)
    return bool(box[0])
