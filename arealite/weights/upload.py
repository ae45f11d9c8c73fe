"""The trainer's half of a weight update (protocol sections 5 and 6).

Disk: every rank gathers, rank 0 writes an HF directory at ``meta.path`` and then, last, the
marker ``meta.disk_ready_marker`` (``meta.write_disk_marker()``: ``{"version": v}``, fsynced, then renamed, so a
reader never sees a partial marker) that the client waits for.

Distributed: rank 0 joins the weight-update group exactly as SGLang builds it
(``init_custom_process_group``: ``tcp://master_address:master_port``, rank 0 hosting the
TCPStore, ``PrefixStore(group_name)``) and keeps it for later updates. For each bucket of
``meta.param_specs`` every trainer rank gathers the full tensors (FSDP2 all-gather, a
collective of the training group) and rank 0 alone issues one ``broadcast(src=0)`` of the
bucket flattened to uint8 (``load_format="flattened_bucket"``). Every step is time-boxed by
``meta.timeout``; on failure rank 0 keeps joining the gathers so that the other ranks never
hang, and all ranks raise the same ``WeightUploadError`` at the end.

When the client set ``meta.receiver = "vllm"`` (vLLM servers), rank 0 instead sends over
vLLM's own NCCL weight transfer (``vllm_weight_send``); the gathers are the same.
"""

from __future__ import annotations

import gc
import logging
import math
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from arealite.api.io_struct import ParamSpec, WeightUpdateMeta
from arealite.backends.vllm.weight_send import VLLMSender
from arealite.utils.distributed import destroy_custom_process_group, init_custom_process_group
from arealite.utils.fsdp import full_tensor
from arealite.weights.verify import dtype_name, tensor_checksum

logger = logging.getLogger("arealite.weights.upload")
T = TypeVar("T")


# a bucket laid out for packing: (total bytes, [(parameter, dtype, start byte, end byte), ...])
Bucket = tuple[int, list[tuple[nn.Parameter, torch.dtype, int, int]]]


@torch.no_grad()
def _gather(p: nn.Parameter) -> torch.Tensor:
    """The full value of a parameter. A DTensor on a one-device mesh already holds it locally:
    skip DTensor's redistribute machinery (~50 us of Python per parameter); otherwise it is
    FSDP2's all-gather (a collective of the training group)."""
    if isinstance(p, DTensor) and p.device_mesh.size() == 1 and p._local_tensor.shape == p.shape:
        return p._local_tensor.detach()
    return full_tensor(p.detach())


class WeightUploadError(RuntimeError):
    """A weight upload failed (on rank 0; every trainer rank raises it)."""


def _detached(e: BaseException) -> WeightUploadError:
    """``e``'s message without its traceback: the traceback's frames hold the failed send
    and through it the process group, whose sockets must close when we drop it."""
    if isinstance(e, WeightUploadError):
        return WeightUploadError(str(e))
    return WeightUploadError(f"{type(e).__name__}: {e}")


def _check_abort(meta: WeightUpdateMeta) -> None:
    if meta.abort_reason:
        raise WeightUploadError(f"the client gave up on this update: {meta.abort_reason}")


def _abortable(meta: WeightUpdateMeta, deadline: float, join: Callable[[], T],
               free: Callable[[Any], None] = destroy_custom_process_group) -> T:
    """``join()`` (a rendezvous that blocks until every rank came, up to its own timeout) on
    a daemon thread, given up when the client sets ``meta.abort_reason``: a server that died
    before joining never comes, and the client knows it long before the timeout. A given-up
    rendezvous finishes (or times out) on its own thread; a group it still makes is freed."""
    box: dict[str, Any] = {}
    done = threading.Event()
    lock = threading.Lock()

    def run() -> None:
        try:
            out = join()
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            out, box["err"] = None, e
        with lock:
            if box.get("abandoned"):
                free(out)
                return
            box["out"] = out
            done.set()

    threading.Thread(target=run, name="weight-group-join", daemon=True).start()
    while not done.wait(0.01):
        if meta.abort_reason or time.monotonic() >= deadline + 5:
            with lock:
                if not done.is_set():
                    box["abandoned"] = True
                    _check_abort(meta)
                    raise WeightUploadError("the weight-update group's rendezvous did not end")
    if "err" in box:
        raise box["err"]
    return box["out"]


def param_specs(model: nn.Module, bucket_size_mb: float) -> list[list[ParamSpec]]:
    """Parameters in ``named_parameters`` order (tied weights once), cut into buckets.

    A bucket closes before a parameter that would take it past ``bucket_size_mb`` or would
    start at a byte offset not divisible by its dtype's size (the server rejects unaligned
    tensors); a parameter larger than the budget gets a bucket of its own.
    """
    if bucket_size_mb <= 0:
        raise ValueError(f"bucket_size_mb must be positive, got {bucket_size_mb}")
    limit = int(bucket_size_mb * 1024 * 1024)
    buckets: list[list[ParamSpec]] = []
    cur: list[ParamSpec] = []
    used = 0
    for name, p in model.named_parameters():
        spec = ParamSpec(name, tuple(int(s) for s in p.shape), str(p.dtype).removeprefix("torch."))
        item = p.element_size()
        if cur and (used + spec.nbytes > limit or used % item):
            buckets.append(cur)
            cur, used = [], 0
        cur.append(spec)
        used += spec.nbytes
    if cur:
        buckets.append(cur)
    return buckets


class DistributedUploader:
    """Rank 0's weight-update group, built on first use and kept across updates."""

    def __init__(self, backend: str, device: torch.device):
        self.backend = backend
        self.device = device
        self.pg: dist.ProcessGroup | None = None
        self.key: tuple | None = None
        self._bufs: list[torch.Tensor | None] = [None, None]
        # meta.receiver == "vllm": vLLM's transfer engine, made on the first such update (a run
        # on SGLang or embedded servers never builds or closes one)
        self.vllm: VLLMSender | None = None

    def close(self) -> None:
        if self.vllm is not None:
            self.vllm.close()
        destroy_custom_process_group(self.pg)
        self.pg, self.key = None, None
        self._bufs = [None, None]

    def _wait_world_size(self, meta: WeightUpdateMeta, deadline: float) -> int:
        # The client learns the servers' tp sizes from /server_info and sets meta.world_size,
        # possibly on its own thread just after update_weights(meta) returned.
        waited = False
        while meta.world_size is None:
            _check_abort(meta)
            if time.monotonic() >= deadline:
                raise WeightUploadError(
                    "meta.world_size was never set (1 + Σ tp_size of the servers; the client's "
                    "update_weights sets it, or set it yourself)"
                )
            waited = True
            time.sleep(0.002)
        if waited:
            # the client publishes backend in the statement after world_size: let it land
            t_backend = time.monotonic() + 0.05
            while meta.backend is None and time.monotonic() < t_backend:
                time.sleep(0.001)
        return int(meta.world_size)

    def _group(self, meta: WeightUpdateMeta, deadline: float) -> dist.ProcessGroup:
        if meta.master_port is None:
            raise WeightUploadError("a distributed weight update needs meta.master_port")
        world = self._wait_world_size(meta, deadline)
        backend = meta.backend or self.backend
        key = (meta.master_address, int(meta.master_port), meta.group_name, world, backend)
        if self.pg is not None and self.key == key:
            return self.pg
        if self.key is not None and self.key[2] == meta.group_name:
            self.close()  # a group name is unique within a process
        left = max(1.0, deadline - time.monotonic())
        # A new group (e.g. rebuilt, under a new name, over the servers left after one died)
        # is made before the old one is destroyed: on the same port both share one
        # multi-tenant TCPStore server, which must stay up while the servers connect to it.
        pg = _abortable(meta, deadline, lambda: init_custom_process_group(
            backend=backend,
            init_method=f"tcp://{meta.master_address}:{int(meta.master_port)}",
            world_size=world,
            rank=0,
            group_name=meta.group_name,
            timeout=left,
        ))
        self.close()
        self.pg, self.key = pg, key
        return self.pg

    def _layout(self, params: dict[str, nn.Parameter], meta: WeightUpdateMeta) -> list[Bucket]:
        """Check ``meta.param_specs`` against the model and lay out each bucket once per upload:
        ``(total_bytes, [(param, dtype, start, end), ...])`` (no per-tensor dtype look-ups or
        ``nbytes`` recomputation inside the copy loop)."""
        if not meta.param_specs:
            raise WeightUploadError("meta.param_specs is empty: fill it with get_param_specs()")
        out: list[Bucket] = []
        for bucket in meta.param_specs:
            off, items = 0, []
            for spec in bucket:
                p = params.get(spec.name)
                if p is None:
                    raise WeightUploadError(f"unknown parameter {spec.name!r} in meta.param_specs")
                if tuple(p.shape) != tuple(spec.shape):
                    raise WeightUploadError(
                        f"{spec.name}: spec shape {tuple(spec.shape)} != model {tuple(p.shape)}"
                    )
                dt = getattr(torch, spec.dtype, None)
                if not isinstance(dt, torch.dtype):
                    raise WeightUploadError(f"{spec.name}: unknown dtype {spec.dtype!r}")
                if off % dt.itemsize:
                    raise WeightUploadError(f"{spec.name}: byte offset {off} in its bucket is "
                                            f"not a multiple of {dt.itemsize} (servers reject it)")
                end = off + math.prod(spec.shape) * dt.itemsize
                items.append((p, dt, off, end))
                off = end
            out.append((off, items))
        return out

    def _buffer(self, k: int, nbytes: int, device: torch.device) -> torch.Tensor:
        """Send buffer ``k`` (two, used alternately), kept across buckets and updates: a fresh
        allocation per bucket costs more than the copy itself (page faults)."""
        b = self._bufs[k]
        if b is None or b.numel() < nbytes or b.device != device:
            b = self._bufs[k] = torch.empty(nbytes, dtype=torch.uint8, device=device)
        return b[:nbytes]

    def upload(self, model: nn.Module, meta: WeightUpdateMeta, is_rank0: bool) -> float:
        """Broadcast every bucket (collective over the training group). Returns seconds.

        Double-buffered: while bucket i is on the wire, every rank gathers bucket i + 1 and
        rank 0 packs it into the other buffer.
        """
        layout = self._layout(dict(model.named_parameters()), meta)
        t0 = time.monotonic()
        deadline = t0 + meta.timeout
        err: BaseException | None = None
        pg = send = None
        if is_rank0:
            try:
                self._wait_world_size(meta, deadline)  # the client then has set meta.receiver
                if meta.receiver == "vllm":
                    self.vllm = self.vllm or VLLMSender(self.device)
                    send = self.vllm.start(meta, deadline, _abortable)
                else:
                    pg = self._group(meta, deadline)
            except Exception as e:  # noqa: BLE001 - reported after the collectives below
                err = _detached(e)
        pending: list = [None, None]
        names = [[spec.name for spec in bucket] for bucket in meta.param_specs]
        want_dt = getattr(torch, meta.checksum_dtype) if meta.checksum_dtype else None
        sums: dict[str, tuple[str, str]] = {}

        def wait(k: int) -> None:
            work = pending[k]
            if work is not None:
                # Poll rather than block: a peer that is alive but was never told to receive
                # (its HTTP call failed) leaves the send pending; the client's abort ends it.
                pause = 1e-5
                while not work.is_completed():
                    _check_abort(meta)
                    if time.monotonic() >= deadline:
                        raise TimeoutError(f"weight upload exceeded {meta.timeout:.0f} s")
                    time.sleep(pause)
                    pause = min(pause * 2, 0.001)
                work.wait(timeout=timedelta(seconds=max(1.0, deadline - time.monotonic())))
                pending[k] = None

        for i, (nbytes, items) in enumerate(layout):
            # every rank gathers (FSDP2 all-gather); only rank 0 packs and sends
            parts = [_gather(p) for p, _, _, _ in items]
            if not is_rank0 or err is not None:
                continue
            if send is not None:
                try:
                    send.put(names[i], parts, deadline)
                except Exception as e:  # noqa: BLE001
                    err = _detached(e)
                continue
            try:
                k = i % 2
                wait(k)
                dev = torch.device("cpu") if self.key[-1] == "gloo" else self.device
                buf = self._buffer(k, nbytes, dev)
                for (_, dt, a, b), t in zip(items, parts):
                    # the bucket's only copy: straight into its slice (casts if needed)
                    buf[a:b].view(dt).view(t.shape).copy_(t)
                pending[k] = dist.broadcast(buf, src=0, group=pg, async_op=True)
                if meta.verify:  # while the bucket is on the wire: hash what was sent
                    for n, (_, dt, a, b), t in zip(names[i], items, parts):
                        sent = buf[a:b].view(dt).view(t.shape)
                        dt_out = want_dt or dt
                        sums[n] = (dtype_name(dt_out), tensor_checksum(sent, dt_out))
            except Exception as e:  # noqa: BLE001
                err = _detached(e)
        if is_rank0 and err is None:
            try:
                if send is not None:
                    send.finish(deadline)
                else:
                    wait(0)
                    wait(1)
            except Exception as e:  # noqa: BLE001
                err = _detached(e)
        if is_rank0 and err is None and meta.verify:
            meta.checksums = sums  # the client compares the servers' /weights_checker with these
        if err is not None:
            # A broken collective leaves the group unusable. Drop every reference to it (the
            # pending sends hold one) so its sockets close now: a live server blocked in a
            # receive from us then fails at once instead of waiting out its group timeout.
            pending[:] = [None, None]
            pg = send = None
            self.close()
            gc.collect()
        failed = torch.tensor([1 if err is not None else 0], device=self._default_device())
        if dist.is_initialized():
            dist.all_reduce(failed, op=dist.ReduceOp.MAX)
        if int(failed.item()):
            msg = f"distributed weight upload to version {meta.version} failed"
            if err is not None:
                raise WeightUploadError(f"{msg}: {err}")
            raise WeightUploadError(f"{msg} on rank 0")
        return time.monotonic() - t0

    def _default_device(self) -> torch.device:
        # the training group's backend follows the engine's device (nccl needs CUDA tensors)
        return self.device if self.backend == "nccl" else torch.device("cpu")


def disk_checksums(
    model: nn.Module, state: dict[str, torch.Tensor] | None, dtype: str | None
) -> dict[str, tuple[str, str]]:
    """name -> (dtype, checksum) of the parameters a disk update wrote (``state``: the full
    state dict ``save_hf`` returned), each cast to ``dtype`` (the servers' dtype) when set."""
    want = getattr(torch, dtype) if dtype else None
    out = {}
    for name, _ in model.named_parameters():  # tied weights once, as a server lists them
        t = (state or {}).get(name)
        if t is not None:
            dt = want or t.dtype
            out[name] = (dtype_name(dt), tensor_checksum(t, dt))
    return out
