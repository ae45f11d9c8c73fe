"""The tensor transport's two halves (``arealite.weights.tensor``).

The client's half publishes the paused servers to the trainer and waits for the trainer's
report (which servers failed), an abort, or its timeout. The trainer's half
(``upload_by_reference``), when a call fails before the server reads it, gives back the
references its payload took, so the shared-memory blocks go when the tensors do instead of
staying until the trainer exits."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time

import pytest
import torch
from torch import nn

from arealite.api.io_struct import WeightUpdateMeta
from arealite.utils.network import LOOPBACK, find_free_port
from arealite.weights.tensor import await_tensor_push, payload_unread, upload_by_reference
from arealite.weights.upload import WeightUploadError


def trainer(meta: WeightUpdateMeta, report: dict[str, str] | None = None,
            abort: str | None = None) -> threading.Thread:
    """A trainer rank 0 that waits for the targets, then reports (or aborts)."""
    def run() -> None:
        while meta.targets is None:
            time.sleep(0.001)
        if abort:
            meta.abort_reason = abort
        else:
            meta.target_failures = report or {}
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_publishes_targets_and_reports_per_server_failures():
    meta = WeightUpdateMeta.tensor(3)
    trainer(meta, {"b:2": "HTTP 400: shape mismatch"})
    failed: dict[str, str] = {}
    alive, why = asyncio.run(await_tensor_push(["a:1", "b:2"], meta, failed, timeout=10))
    assert (alive, why) == (["a:1"], None) and meta.targets == ["a:1", "b:2"]
    assert failed == {"b:2": "/update_weights_from_tensor: HTTP 400: shape mismatch"}


def test_a_trainer_that_fails_or_never_pushes_fails_the_update():
    meta = WeightUpdateMeta.tensor(4)
    trainer(meta, abort="WeightUploadError: gather failed")
    alive, why = asyncio.run(await_tensor_push(["a:1"], meta, {}, timeout=10))
    assert alive == [] and "gather failed" in why
    meta = WeightUpdateMeta.tensor(5)
    trainer(meta, {"*": "meta.targets was never set"})
    assert "never set" in asyncio.run(await_tensor_push(["a:1"], meta, {}, timeout=10))[1]
    t0 = time.monotonic()
    alive, why = asyncio.run(await_tensor_push(["a:1"], WeightUpdateMeta.tensor(6), {}, 0.2))
    assert "did not push the weights within" in why and time.monotonic() - t0 < 5


def block_file(t: torch.Tensor) -> str:
    return "/dev/shm" + t.untyped_storage()._share_filename_cpu_()[1].decode()


def test_which_failures_leave_the_payload_unread():
    assert payload_unread("/update_weights_from_tensor: URLError: <urlopen error "
                          "[Errno 111] Connection refused>")
    assert payload_unread("/update_weights_from_tensor: HTTP 422: {\"detail\": []}")
    assert payload_unread("/update_weights_from_tensor: HTTP 401: unauthorized")
    # read (or maybe read): the server consumed the references
    assert not payload_unread("/update_weights_from_tensor: HTTP 400: {\"success\": false, "
                              "\"message\": \"Failed to update weights: shape mismatch\"}")
    assert not payload_unread("/update_weights_from_tensor: TimeoutError: timed out")
    assert not payload_unread("refused: {'success': False}")


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm to look at")
def test_a_push_nobody_read_frees_its_blocks_with_the_tensors():
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 8))
    dead = f"{LOOPBACK}:{find_free_port()}"  # nothing listens: connection refused
    meta = WeightUpdateMeta.tensor(1, bucket_size_mb=0.01, timeout=30)
    meta.targets = [dead]
    with pytest.raises(WeightUploadError, match="Connection refused"):
        upload_by_reference(model, meta, rank=0, world=1)
    files = [block_file(p) for p in model.parameters()]
    assert all(p.is_shared() for p in model.parameters())
    assert all(os.path.exists(f) for f in files)
    # the parameters themselves: every bucket in one call
    assert meta.target_failures[dead].startswith("buckets 1-2/2: ")
    del model
    gc.collect()
    # every block's count is back to the trainer's own: gone with it (before the fix, each
    # stayed in /dev/shm until the process exited)
    assert [f for f in files if os.path.exists(f)] == []
