"""FSDP2 across gloo processes: 2 ranks == 1 rank, DCP 2 ranks -> 1 rank, broadcast upload."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import torch

from arealite.utils.network import find_free_port, find_free_ports
from tests.support.procs import log_tail, spawn

WORKER = Path(__file__).resolve().parents[1] / "support" / "fsdp_worker.py"
PEER = Path(__file__).resolve().parents[1] / "support" / "group_peer.py"
ROOT = Path(__file__).resolve().parents[2]


def run_ranks(world: int, args: list[str], timeout: float = 120.0,
              extra: list[list[str]] | None = None, port: int | None = None) -> None:
    """Start ``world`` worker ranks (torchrun's env vars, ``MASTER_PORT=port``) plus ``extra``
    commands; wait for all. On failure every process's exit code and log tail is shown, the
    one that failed first included (the others are often just left waiting for it)."""
    port = port or find_free_port()
    cmds = []
    for r in range(world):
        env = {"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(world),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "PYTHONPATH": str(ROOT)}
        cmds.append(([sys.executable, str(WORKER), *args], env))
    for c in extra or []:
        cmds.append((c, {"PYTHONPATH": str(ROOT)}))
    ctxs = [spawn(c, env=e) for c, e in cmds]
    procs = [ctx.__enter__() for ctx in ctxs]
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            codes = [p.poll() for p, _ in procs]
            if any(c not in (None, 0) for c in codes) or all(c == 0 for c in codes):
                break
            time.sleep(0.1)
        codes = [p.poll() for p, _ in procs]
        if any(c != 0 for c in codes):
            waited = time.monotonic() >= deadline
            report = [f"process {i} ({' '.join(map(str, cmds[i][0][1:3]))}): rc={c}\n"
                      f"{log_tail(log)}" for i, (c, (_, log)) in enumerate(zip(codes, procs))]
            head = f"timed out after {timeout:.0f} s" if waited else "a process failed"
            pytest.fail(head + "\n" + "\n".join(report))
    finally:
        for ctx in ctxs:
            ctx.__exit__(None, None, None)


def _close(a: dict, b: dict, tol: float) -> float:
    worst = 0.0
    for k in a:
        worst = max(worst, float((a[k].float() - b[k].float()).abs().max()))
    assert worst < tol, worst
    return worst


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_two_ranks_equal_one_rank_and_dcp_resumes_on_one_rank(tiny_model_dir, tmp_path):
    m = str(tiny_model_dir)
    run_ranks(1, ["--mode", "train", "--model", m, "--out", str(tmp_path / "w1.pt")])
    run_ranks(2, ["--mode", "train", "--model", m, "--out", str(tmp_path / "w2.pt"),
                  "--save-dcp", str(tmp_path / "dcp"), "--save-after", "2"])
    w1, w2 = torch.load(tmp_path / "w1.pt"), torch.load(tmp_path / "w2.pt")
    assert (w1["world_size"], w2["world_size"]) == (1, 2)
    for s1, s2 in zip(w1["stats"], w2["stats"]):
        assert abs(s1["loss"] - s2["loss"]) < 1e-4, (s1["loss"], s2["loss"])
        assert abs(s1["advantages/avg"] - s2["advantages/avg"]) < 1e-5
        assert s1["n_tokens"] == s2["n_tokens"] and s1["lr"] == s2["lr"]
    assert len(w1["stats"]) == 3
    # the parameters really moved (by ~lr per step), and moved the same way on both layouts
    from safetensors.torch import load_file

    init = load_file(str(tiny_model_dir / "model.safetensors"))
    assert max(float((w1["params"][k] - init[k]).abs().max()) for k in init) > 1e-3
    _close(w1["params"], w2["params"], 1e-4)
    # DCP written by 2 ranks after step 2, loaded on 1 rank, step 3 again: same result
    run_ranks(1, ["--mode", "resume", "--model", m, "--out", str(tmp_path / "r1.pt"),
                  "--load-dcp", str(tmp_path / "dcp"), "--start-step", "2", "--steps", "1"])
    r1 = torch.load(tmp_path / "r1.pt")
    assert abs(r1["stats"][0]["loss"] - w2["stats"][2]["loss"]) < 1e-5
    assert abs(r1["stats"][0]["lr"] - w2["stats"][2]["lr"]) < 1e-12  # scheduler state restored
    _close(r1["params"], w2["params"], 1e-5)


@pytest.mark.integration
@pytest.mark.timeout(200)
def test_distributed_upload_from_two_ranks_to_a_peer(tiny_model_dir, tmp_path):
    """Both trainer ranks gather, rank 0 broadcasts flattened buckets; the peer (a server's
    stand-in) receives exactly the full parameters, twice over one group. Before that, a
    train step on very uneven ranks (equal micro-batch counts, dummy rows) must not hang."""
    # the ranks' store and the weight-update group's: two distinct ports picked together
    port, wport = find_free_ports(2)
    out = tmp_path / "up.pt"
    # the peer needs the bucket layout: compute it the same way the trainer will
    from arealite.engine.fsdp_engine import FSDPEngine
    from tests.support.fsdp_helpers import engine_config

    e = FSDPEngine(engine_config(tiny_model_dir, optimizer=None), device="cpu", backend="gloo")
    e.initialize()
    specs = [[[s.name, s.dtype, list(s.shape)] for s in b] for b in e.get_param_specs(0.05)]
    e.destroy()
    (tmp_path / "specs.json").write_text(json.dumps(specs))
    peer = [sys.executable, str(PEER), "--init-method", f"tcp://127.0.0.1:{wport}", "--rank", "1",
            "--world-size", "2", "--group-name", "wu_fsdp", "--specs", str(tmp_path / "specs.json"),
            "--out", str(tmp_path / "peer.pt"), "--rounds", "2", "--timeout", "60"]
    run_ranks(2, ["--mode", "upload", "--model", str(tiny_model_dir), "--out", str(out),
                  "--master-port", str(wport)], extra=[peer], port=port)
    sent = torch.load(out)
    got = torch.load(tmp_path / "peer.pt")
    assert sent["n_buckets"] > 1 and len(got) == 2
    counts = sent["mb_counts"]
    assert counts[0] == counts[1] and counts[0] > 1, counts  # rank 1 ran dummy micro-batches
    assert sent["skew_stats"]["update_successful"] == 1.0
    for rnd in range(2):
        assert set(got[rnd]) == set(sent["uploaded"][rnd])
        for k, v in sent["uploaded"][rnd].items():
            assert torch.equal(got[rnd][k], v), k
    # the second round carries the trained weights, not the first ones again
    assert any(not torch.equal(got[0][k], got[1][k]) for k in got[0])


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_lora_ppo_two_ranks_equal_one_rank(tiny_model_dir, tmp_path):
    """LoRA on sharded FSDP2: the adapter (sharded with its layers) trains the same on 2 ranks
    as on 1, under the PPO loss, and the gathered adapter has peft's saved keys; its DCP
    checkpoint (adapter and optimizer state only) resumes on 1 rank."""
    from arealite.engine.lora import gather_adapter
    from tests.support.fsdp_worker import make_actor, step

    m = str(tiny_model_dir)
    run_ranks(2, ["--mode", "train", "--lora", "--model", m, "--out", str(tmp_path / "l2.pt"),
                  "--save-dcp", str(tmp_path / "dcp"), "--save-after", "2"])
    l2 = torch.load(tmp_path / "l2.pt")
    # the one-rank reference in this process (a world of one), as the worker runs it
    torch.manual_seed(0)
    actor = make_actor(m, lora=True)
    l1 = {"stats": [step(actor, i) for i in range(3)], "params": gather_adapter(actor.model)}
    actor.destroy()
    for s1, s2 in zip(l1["stats"], l2["stats"]):
        assert abs(s1["loss"] - s2["loss"]) < 1e-4, (s1["loss"], s2["loss"])
    keys = set(l1["params"])
    assert keys == set(l2["params"]) and all(".lora_A.weight" in k or ".lora_B.weight" in k
                                             for k in keys)
    _close(l1["params"], l2["params"], 1e-4)
    # the adapter-only DCP checkpoint written by 2 ranks after step 2 resumes on 1 rank: step 3
    # again gives the same loss and adapter (the frozen base comes from the model folder)
    from torch.distributed.checkpoint import FileSystemReader

    from arealite.api.io_struct import SaveLoadMeta
    from arealite.engine.lora import is_adapter_param

    saved = FileSystemReader(str(tmp_path / "dcp")).read_metadata().state_dict_metadata
    assert all(is_adapter_param(k) for k in saved if k.startswith("model."))
    torch.manual_seed(0)
    actor = make_actor(m, lora=True)
    actor.load(SaveLoadMeta(path=str(tmp_path / "dcp"), weight_format="dcp", with_optim=True))
    again = step(actor, 2)
    resumed = gather_adapter(actor.model)
    actor.destroy()
    assert abs(again["loss"] - l2["stats"][2]["loss"]) < 1e-5
    _close(resumed, l2["params"], 1e-5)
