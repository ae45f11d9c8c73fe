"""The trainer's same-host push (``upload_by_reference``) when a call fails before the server
reads it: the references its payload took are given back, so the shared-memory blocks go when
the tensors do instead of staying until the trainer exits."""

from __future__ import annotations

import gc
import os

import pytest
import torch
from torch import nn

from arealite.api.io_struct import WeightUpdateMeta
from arealite.utils.network import LOOPBACK, find_free_port
from arealite.weights.tensor_upload import payload_unread, upload_by_reference
from arealite.weights.upload import WeightUploadError


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
