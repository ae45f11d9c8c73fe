"""Rank 0's send of a distributed update to vLLM servers, over vLLM's own NCCL weight transfer
(the client's half: ``arealite.backends.vllm.weight_transfer``).

vLLM's trainer-side helpers, imported only when this path runs (the trainer's environment
needs ``vllm`` and CUDA; checked against vLLM 0.32):
``vllm.distributed.weight_transfer.nccl_common.trainer_init({master_address, master_port,
world_size}, rank=0)`` hosts the group's TCPStore and returns a ``PyNcclCommunicator`` once
every server worker joined (each through ``/init_weight_transfer_engine``), and
``vllm.distributed.weight_transfer.packed_tensor.packed_nccl_broadcast_producer`` packs the
tensors into chunks of ``packed_buffer_size_bytes`` and broadcasts them from rank 0, exactly as
the servers' ``packed_nccl_broadcast_consumer`` unpacks them.

Every trainer rank gathers the parameters in ``meta.param_specs`` order (FSDP2 all-gather, a
collective of the training group) in ``DistributedUploader.upload``; rank 0 hands each bucket
to the producer, which runs on its own thread so the main thread can give up (``meta.timeout``,
``meta.abort_reason``) while a broadcast waits for a server that never comes.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch

from arealite.api.io_struct import SEND_BUFFERS, WeightUpdateMeta

HINT = ("vLLM's native weight transfer needs CUDA and the vllm package in the trainer's "
        "environment; otherwise set weight_update.type=disk")
_END = object()


def _vllm_helpers() -> tuple[Any, Any]:
    """(trainer_init, packed_nccl_broadcast_producer) from vLLM, or a one-line error."""
    if not torch.cuda.is_available():
        raise RuntimeError(f"no CUDA device: {HINT}")
    try:
        from vllm.distributed.weight_transfer.nccl_common import trainer_init
        from vllm.distributed.weight_transfer.packed_tensor import packed_nccl_broadcast_producer
    except ImportError as e:
        raise RuntimeError(f"cannot import vLLM's weight transfer ({e}): {HINT}") from None
    return trainer_init, packed_nccl_broadcast_producer


class VLLMSend:
    """One update's send: ``put`` each gathered bucket, then ``finish``. The group (a
    ``PyNcclCommunicator``) is the caller's, kept across updates."""

    def __init__(self, comm: Any, producer: Any, meta: WeightUpdateMeta, device: torch.device):
        self.meta = meta
        self.q: queue.Queue = queue.Queue(maxsize=2)  # buckets gathered but not yet packed
        self.err: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(comm, producer, device),
                                       name="vllm-weight-send", daemon=True)
        self.thread.start()

    def _items(self) -> Iterator[tuple[str, torch.Tensor]]:
        while (item := self.q.get()) is not _END:
            event, names, parts = item
            stream = torch.cuda.current_stream()  # the producer's, inside its stream context
            stream.wait_event(event)  # the gather ran on the main thread's stream
            for name, t in zip(names, parts):
                t.record_stream(stream)  # its memory is not reused before the pack read it
                yield name, t

    def _run(self, comm: Any, producer: Any, device: torch.device) -> None:
        try:
            torch.cuda.set_device(device)
            producer(iterator=self._items(), group=comm, src=0,
                     post_iter_func=lambda item: item[1],
                     buffer_size_bytes=self.meta.bucket_bytes, num_buffers=SEND_BUFFERS)
        except BaseException as e:  # noqa: BLE001 - raised on the main thread by _check
            self.err = e

    def put(self, names: list[str], parts: list[torch.Tensor], deadline: float) -> None:
        event = torch.cuda.Event()
        event.record()
        self._offer((event, names, parts), deadline)

    def _offer(self, item: Any, deadline: float) -> None:
        while True:
            self._check(deadline)
            try:
                self.q.put(item, timeout=0.01)
                return
            except queue.Full:
                continue

    def _check(self, deadline: float) -> None:
        if self.err is not None:
            raise self.err
        if self.meta.abort_reason:
            raise RuntimeError(f"the client gave up on this update: {self.meta.abort_reason}")
        if time.monotonic() >= deadline:
            raise TimeoutError(f"weight send exceeded {self.meta.timeout:.0f} s")
        if not self.thread.is_alive():
            raise RuntimeError("vLLM's broadcast producer ended early")

    def finish(self, deadline: float) -> None:
        """Wait until every chunk reached the servers (vLLM's producer drains its streams)."""
        self._offer(_END, deadline)
        while self.thread.is_alive():
            self._check(deadline)
            self.thread.join(0.01)
        if self.err is not None:
            raise self.err


class VLLMSender:
    """Rank 0's group with the vLLM servers' transfer engines, joined on first use and kept
    across updates (a new one when the client's layout changes: a server died)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.comm: Any = None
        self.key: tuple | None = None
        self.last: VLLMSend | None = None

    def close(self) -> None:
        # A producer still blocked in a broadcast uses the communicator: destroying it under
        # that thread can hang too, so a failed send's group is only dropped.
        if self.comm is not None and not (self.last and self.last.thread.is_alive()):
            _destroy(self.comm)
        self.comm, self.key, self.last = None, None, None

    def start(self, meta: WeightUpdateMeta, deadline: float, abortable: Any) -> VLLMSend:
        """Join (or reuse) the group and start the producer. ``abortable(meta, deadline, join,
        free)`` runs the rendezvous so that the client's abort ends the wait."""
        trainer_init, producer = _vllm_helpers()
        key = (meta.master_address, int(meta.master_port), int(meta.world_size), meta.bucket_bytes)
        if self.comm is None or self.key != key:
            self.close()
            info = {"master_address": meta.master_address, "master_port": int(meta.master_port),
                    "world_size": int(meta.world_size)}

            def join() -> Any:
                torch.cuda.set_device(self.device)
                return trainer_init(info, rank=0)

            self.comm = abortable(meta, deadline, join, _destroy)
            self.key = key
        self.last = VLLMSend(self.comm, producer, meta, self.device)
        return self.last


def _destroy(comm: Any) -> None:
    if comm is not None:
        comm.destroy()
