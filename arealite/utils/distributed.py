"""torch.distributed helpers shared by the trainer and the weight-update client.

`init_custom_process_group` builds a process group that is *not* the default group, exactly the
way SGLang's `init_custom_process_group` (python/sglang/srt/utils/common.py) does, so that a
trainer (rank 0, hosting the TCPStore) and SGLang-protocol servers (ranks 1..N) meet in the same
rendezvous: ``rendezvous(init_method)`` -> ``PrefixStore(group_name, store)`` ->
``_new_process_group_helper(...)``. See docs/protocol.md section 6. Both sides must use the same
URL, the same group name and the same world size, otherwise store keys differ and init hangs
(until ``timeout``).
"""

from __future__ import annotations

import datetime as _dt
import inspect
import os
import socket

import torch
import torch.distributed as dist

__all__ = [
    "init_custom_process_group",
    "destroy_custom_process_group",
    "resolve_device",
    "resolve_backend",
    "init_default_process_group",
    "group_world_size",
    "all_reduce",
]


def group_world_size(group: dist.ProcessGroup | None = None) -> int:
    """Ranks in ``group`` (the world by default); 1 when torch.distributed is not initialised."""
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group)


def all_reduce(t: torch.Tensor, op=dist.ReduceOp.SUM, group: dist.ProcessGroup | None = None) -> None:
    """``dist.all_reduce`` that skips a group of one (where it is the identity): a gloo
    all-reduce costs ~1.5 ms even then, several times per trainer step."""
    if group_world_size(group) > 1:
        dist.all_reduce(t, op=op, group=group)


def _as_timedelta(timeout: float | _dt.timedelta | None) -> _dt.timedelta:
    if timeout is None:
        from torch.distributed.distributed_c10d import default_pg_timeout

        return default_pg_timeout
    if isinstance(timeout, _dt.timedelta):
        return timeout
    if timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout}")
    return _dt.timedelta(seconds=float(timeout))


def _tcp_store(init_method: str | None, rank: int, world_size: int, timeout: _dt.timedelta):
    """For ``tcp://host:port``: the same store ``rendezvous`` builds, with rank 0 hosting it.

    ``rendezvous`` itself must not be used under torchrun: torchrun sets
    ``TORCHELASTIC_USE_AGENT_STORE``, and rendezvous then makes *every* rank a client of the
    agent's store, so the trainer (rank 0 of the weight-update group) never hosts the store
    the servers connect to and the group init hangs."""
    from urllib.parse import urlparse

    from torch.distributed import TCPStore

    if not init_method or not init_method.startswith("tcp://"):
        return None
    u = urlparse(init_method)
    if u.hostname is None or u.port is None:
        raise ValueError(f"init_method {init_method!r} needs tcp://host:port")
    return TCPStore(u.hostname, u.port, world_size, is_master=rank == 0, timeout=timeout,
                    multi_tenant=True)


def init_custom_process_group(
    backend: str | None = None,
    init_method: str | None = None,
    world_size: int = -1,
    rank: int = -1,
    group_name: str | None = None,
    timeout: float | _dt.timedelta | None = None,
    store: dist.Store | None = None,
    pg_options: object | None = None,
    device_id: torch.device | None = None,
) -> dist.ProcessGroup:
    """Create a non-default process group the way SGLang's weight updater does.

    ``init_method`` is a ``tcp://host:port`` URL; with ``tcp://`` the process with ``rank == 0``
    hosts the TCPStore server (in the weight-update protocol that is the trainer). ``timeout``
    is in seconds (or a timedelta) and bounds both the rendezvous and later collectives.
    Returns the new ``ProcessGroup``; pass it as ``group=`` to collectives and tear it down with
    :func:`destroy_custom_process_group`.
    """
    # Private torch API, as in SGLang: there is no public way to build a non-default group
    # from an explicit store without first initialising the default group.
    from torch.distributed.distributed_c10d import (
        Backend,
        PrefixStore,
        _new_process_group_helper,
        _world,
        rendezvous,
    )

    if store is not None and init_method is not None:
        raise ValueError("Cannot specify both init_method and store.")
    if group_name is None or not group_name:
        raise ValueError("group_name is required (both sides prefix store keys with it)")
    if world_size <= 0:
        raise ValueError(f"world_size must be positive, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    if store is None and init_method is None:
        init_method = "env://"

    pg_backend = Backend(backend) if backend else Backend("undefined")
    td = _as_timedelta(timeout)

    if store is None:
        store = _tcp_store(init_method, rank, world_size, td)
        if store is None:
            store, rank, world_size = next(rendezvous(init_method, rank, world_size, timeout=td))
        store.set_timeout(td)
        store = PrefixStore(group_name, store)

    # torch >= 2.6 renamed pg_options -> backend_options; pick by signature, not by version.
    params = inspect.signature(_new_process_group_helper).parameters
    opt_name = "backend_options" if "backend_options" in params else "pg_options"
    kwargs = {opt_name: pg_options, "timeout": td}
    if "device_id" in params:
        kwargs["device_id"] = device_id
    pg, _ = _new_process_group_helper(
        world_size, rank, [], pg_backend, store, group_name=group_name, **kwargs
    )
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


def destroy_custom_process_group(pg: dist.ProcessGroup | None) -> None:
    """Destroy a group created by :func:`init_custom_process_group` (no-op for None)."""
    if pg is None:
        return
    from torch.distributed.distributed_c10d import _world

    try:
        dist.destroy_process_group(pg)
    except (AssertionError, RuntimeError, ValueError):
        # Without a default group some torch versions refuse destroy_process_group(pg);
        # drop our bookkeeping and let the backend be freed with the object.
        _world.pg_group_ranks.pop(pg, None)


def resolve_device(device: str = "auto") -> torch.device:
    """Map the config's ``device`` (auto/cpu/cuda) to a torch.device for this process."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return torch.device("cpu")
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("device=cuda requested but CUDA is not available")
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        return torch.device("cuda", local_rank)
    raise ValueError(f"device must be auto/cpu/cuda, got {device!r}")


def resolve_backend(backend: str, device: torch.device) -> str:
    """Map the config's ``dist_backend`` (auto/gloo/nccl) to a backend name for ``device``."""
    if backend == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"dist_backend must be auto/gloo/nccl, got {backend!r}")
    if backend == "nccl" and device.type != "cuda":
        raise ValueError("dist_backend=nccl needs device=cuda")
    return backend


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_default_process_group(
    backend: str, device: torch.device, timeout: float = 1800.0
) -> tuple[int, int]:
    """Initialise the default group from torchrun env vars, or as a world of one.

    Under torchrun ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` are set and used.
    A plain ``python`` process (no ``RANK``) gets a world of size 1 on a free local port, so the
    same code path (FSDP2 over a 1-rank mesh) runs everywhere. Returns ``(rank, world_size)``.
    """
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    td = _dt.timedelta(seconds=timeout)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        kwargs = {}
        if device.type == "cuda":
            torch.cuda.set_device(device)
            kwargs["device_id"] = device
        dist.init_process_group(backend=backend, timeout=td, **kwargs)
    else:
        dist.init_process_group(
            backend=backend,
            init_method=f"tcp://127.0.0.1:{_free_port()}",
            rank=0,
            world_size=1,
            timeout=td,
        )
    return dist.get_rank(), dist.get_world_size()


def rank0_decides(flag: bool) -> bool:
    """Rank 0's ``flag`` on every rank: decisions from a clock (time budget, eval every N
    seconds) must agree, or ranks part ways at the next collective and hang."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return flag
    box = [flag]
    dist.broadcast_object_list(box, src=0)
    return bool(box[0])
