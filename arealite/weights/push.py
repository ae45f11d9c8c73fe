"""The weight push of the RL entry scripts: pause → transfer → resume's middle, the one
choreography of both halves (every rank's trainer half, rank 0's client half over the pool),
with its retries and the checksum re-send. It drives whichever transport the run chose once
(``WeightPushPlan``, from ``arealite.weights.table``); the engine and the client hand that
transport their model and their pool."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist

from arealite.api.config.weights import WeightUpdateConfig
from arealite.api.engine_api import InferenceEngine, TrainEngine
from arealite.api.io_struct import WeightUpdateMeta
from arealite.backends.base import GenerateProtocol
from arealite.utils.distributed import rank0_decides
from arealite.utils.network import find_free_port
from arealite.weights.table import choose_transport, transport_for
from arealite.weights.transport import WeightTransport
from arealite.weights.upload import WeightUploadError
from arealite.weights.verify import WeightVerificationError

logger = logging.getLogger("arealite.weights.push")


@dataclass
class WeightPushPlan:
    """A run's weight pushes, decided once: the transport, the config as it runs (after the
    backend's fallbacks), where versions go on disk, and the broadcast group's port."""

    transport: type[WeightTransport]
    wu: WeightUpdateConfig
    disk_root: Path
    master_port: int

    @classmethod
    def choose(cls, wu: WeightUpdateConfig, lora: bool, protocol: GenerateProtocol,
               servers_on_gpu: bool, disk_root: Path, rank: int) -> WeightPushPlan:
        """The plan on every rank alike (collective when the transport hosts a group: every
        rank learns rank 0's port)."""
        transport, wu = choose_transport(wu, lora, protocol, servers_on_gpu)
        port = [wu.master_port or (find_free_port() if rank == 0 else 0)]
        if dist.is_initialized() and transport.needs_group_port:
            dist.broadcast_object_list(port, src=0)
        return cls(transport, wu, Path(disk_root), int(port[0]))

    def meta(self, version: int, actor: TrainEngine) -> WeightUpdateMeta:
        return weight_meta(self.wu, version, self.disk_root, self.master_port, actor,
                           self.transport)


def weight_meta(
    wu: WeightUpdateConfig, version: int, disk_root: Path, master_port: int, actor: TrainEngine,
    transport: type[WeightTransport],
) -> WeightUpdateMeta:
    """The update to ``version`` as ``transport`` moves it (a disk folder per version, the
    run's one broadcast group, same-host pushes by reference, an adapter); verified
    (``weight_update.verify``) in ``checksum_dtype`` where the transport can be."""
    meta = transport.make_meta(wu, version, disk_root, master_port, actor)
    meta.transport = transport.name
    meta.verify, meta.checksum_dtype = wu.verify and transport.verifiable, wu.checksum_dtype
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
    if not transport_for(meta).retryable or isinstance(err, WeightVerificationError):
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
