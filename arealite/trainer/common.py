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
from arealite.engine.weight_upload import WeightUploadError
from arealite.rollout.weight_verify import WeightVerificationError

logger = logging.getLogger("arealite.trainer.common")


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
    """The update to ``version``: a disk folder per version, the run's one broadcast group, or
    same-host pushes by reference (``tensor``); verified (``weight_update.verify``) in ``checksum_dtype``."""
    if wu.type == "disk":
        meta = WeightUpdateMeta.disk(version, disk_root)
    elif wu.type == "tensor":
        meta = WeightUpdateMeta.tensor(version, wu.bucket_size_mb, wu.timeout)
    else:
        meta = WeightUpdateMeta.broadcast(
            version, actor.get_param_specs(wu.bucket_size_mb), master_port, wu.master_address,
            wu.group_name, wu.bucket_size_mb, wu.timeout,
        )
    meta.verify, meta.checksum_dtype = wu.verify, wu.checksum_dtype
    if getattr(actor, "is_lora", False):
        # only the adapter moves, loaded as <run>-v<k> beside the older versions; the base
        # weights never change, so there is nothing to checksum
        run = Path(disk_root).resolve()
        meta.lora_name = f"{run.parent.parent.name}-{run.parent.name}-v{version}"
        meta.lora_pause = wu.lora_pause
        meta.verify = False
    return meta


def fresh(meta: WeightUpdateMeta) -> WeightUpdateMeta:
    """``meta`` for another attempt: without what the last attempt's two sides published."""
    return dataclasses.replace(meta, world_size=None, checksums=None, abort_reason=None,
                               targets=None, target_failures=None)


def push_weights(
    actor: TrainEngine, rollout: InferenceEngine, meta: WeightUpdateMeta, rank: int,
    timeout: float, retries: int = 1,
) -> None:
    """Servers to ``meta.version``: rank 0's client drives them while every rank uploads (all
    gather; rank 0 writes or broadcasts); then every rank moves its version clock.

    A broadcast that fails because a server died before or inside it is tried again, up to
    ``retries`` times, over the servers still alive (the client rebuilt the group without the
    dead one); the trainer learns of the failure from ``meta.abort_reason`` at once, so a retry
    costs about one update, not ``timeout``."""
    for attempt in range(retries + 1):
        err = _push_once(actor, rollout, meta, rank, timeout)  # the same on every rank
        if err is None:
            break
        retry = attempt < retries and _retryable(rollout, meta, err)
        if not rank0_decides(retry):
            raise err
        logger.warning("weight update to v%d failed (%s); retrying over the live servers",
                       meta.version, err)
        meta = fresh(meta)
    rollout.set_version(meta.version)  # the rank's one clock, shared with the actor


def _retryable(rollout: InferenceEngine, meta: WeightUpdateMeta, err: BaseException) -> bool:
    """A broadcast lost a member (the client took it out of the pool), and servers remain."""
    if meta.type.value != "distributed" or isinstance(err, WeightVerificationError):
        return False
    pool = getattr(rollout, "pool", None)
    return pool is None or bool(pool.healthy_addrs())


def _push_once(
    actor: TrainEngine, rollout: InferenceEngine, meta: WeightUpdateMeta, rank: int, timeout: float
) -> BaseException | None:
    """One update with its checksum re-send; the error (rank 0's client's first) or None."""
    fut = rollout.update_weights(meta) if rank == 0 else None
    err: BaseException | None = None
    try:
        actor.upload_weights(meta)
    except WeightUploadError as e:  # raised on every rank together
        err = e
        meta.abort_reason = meta.abort_reason or str(e)  # the client stops waiting too
    if fut is not None:
        try:
            fut.result(timeout=timeout)
        except WeightVerificationError:
            raise  # a second mismatch: the run stops
        except Exception as e:  # noqa: BLE001 - the client's reason says more than the upload's
            err = e
    resync: list[str] = []
    if fut is not None and err is None:
        resync = list(getattr(rollout.last_weight_update, "resync", None) or [])
    if dist.is_initialized():  # rank 0's outcome on every rank: the same collectives follow
        box = [err is not None, resync]
        dist.broadcast_object_list(box, src=0)
        if box[0] and err is None:
            err = RuntimeError("the weight update failed on rank 0")
        resync = box[1]
    if err is not None:
        return err
    if resync:
        # A server's checksums differed after the broadcast: send it the weights once more,
        # alone (a new group over just it); a second mismatch raises and stops the run.
        again = fresh(meta)
        fut = rollout.resync_weights(again, resync) if rank == 0 else None
        actor.upload_weights(again)
        if fut is not None:
            fut.result(timeout=timeout)
    if dist.is_initialized():
        dist.barrier()
    return None


def rank0_decides(flag: bool) -> bool:
    """Rank 0's ``flag`` on every rank: decisions from a clock (time budget, eval every N
    seconds) must agree, or ranks part ways at the next collective and hang."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return flag
    box = [flag]
    dist.broadcast_object_list(box, src=0)
    return bool(box[0])
