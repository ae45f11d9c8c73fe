"""init_custom_process_group: the trainer (rank 0, here the test process) and a peer process
meet over tcp:// + PrefixStore(group_name), and one flattened bucket arrives bit-identical."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from arealite.utils.distributed import destroy_custom_process_group, init_custom_process_group
from arealite.utils.network import find_free_port
from tests.support.procs import log_tail, spawn

PEER = Path(__file__).resolve().parents[1] / "support" / "group_peer.py"


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="group_name"):
        init_custom_process_group("gloo", "tcp://127.0.0.1:1", 2, 0, group_name="")
    with pytest.raises(ValueError, match="rank"):
        init_custom_process_group("gloo", "tcp://127.0.0.1:1", 2, 2, group_name="g")
    with pytest.raises(ValueError, match="world_size"):
        init_custom_process_group("gloo", "tcp://127.0.0.1:1", 0, 0, group_name="g")


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_flattened_bucket_roundtrip_with_peer(tmp_path):
    torch.manual_seed(0)
    tensors = {
        "a.weight": torch.randn(3, 5),
        "b.bias": torch.randn(7).to(torch.bfloat16),
        "c.half": torch.randn(2, 2).to(torch.float16),
    }
    bucket = [[n, str(t.dtype).removeprefix("torch."), list(t.shape)] for n, t in tensors.items()]
    (tmp_path / "specs.json").write_text(json.dumps([bucket]))
    port = find_free_port()
    url = f"tcp://127.0.0.1:{port}"
    cmd = [
        sys.executable, str(PEER), "--init-method", url, "--rank", "1", "--world-size", "2",
        "--group-name", "wu_test", "--specs", str(tmp_path / "specs.json"),
        "--out", str(tmp_path / "got.pt"), "--timeout", "60",
    ]
    with spawn(cmd) as (proc, log):
        pg = init_custom_process_group(
            backend="gloo", init_method=url, world_size=2, rank=0, group_name="wu_test",
            timeout=60,
        )
        try:
            flat = torch.cat([t.reshape(-1).view(torch.uint8) for t in tensors.values()])
            dist.broadcast(flat, src=0, group=pg)
        finally:
            destroy_custom_process_group(pg)
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.returncode == 0, log_tail(log)
    got = torch.load(tmp_path / "got.pt")[0]
    for n, t in tensors.items():
        assert got[n].dtype == t.dtype and torch.equal(got[n], t), n
