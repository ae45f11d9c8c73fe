"""``launcher.colocate``: the one switch between disaggregated async and co-located sync mode,
on the same config file; the launcher puts trainer rank i on server i's GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from arealite.api.config.experiment import GRPOConfig
from arealite.api.config.loader import load_config
from arealite.launcher import plan

REPO = Path(__file__).resolve().parents[2]
TOY = str(REPO / "configs" / "toy_grpo.yaml")
GPU = str(REPO / "configs" / "gsm8k_grpo_gpu.yaml")


def test_the_switch_sets_what_colocation_implies(caplog):
    off = load_config(TOY, [], GRPOConfig)
    assert (off.async_training, off.weight_update.type, off.launcher.colocate) == (
        True, "distributed", False)
    on = load_config(TOY, ["launcher.colocate=true", "launcher.trainer_nproc=2"], GRPOConfig)
    assert (on.async_training, on.weight_update.type, on.launcher.n_servers) == (False, "tensor", 2)
    assert "async_training=false, weight_update.type=tensor, launcher.n_servers=2" in caplog.text
    # everything else is the same run
    assert on.model_dump(exclude={"async_training", "weight_update", "launcher"}) == off.model_dump(
        exclude={"async_training", "weight_update", "launcher"})
    # a disk update stays a disk update (it works co-located too, on any backend)
    disk = load_config(TOY, ["launcher.colocate=true", "weight_update.type=disk"], GRPOConfig)
    assert disk.weight_update.type == "disk" and disk.launcher.n_servers == 1


def test_colocated_ranks_share_their_servers_gpus(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    cfg = load_config(GPU, ["launcher.colocate=true"], GRPOConfig)
    assert cfg.launcher.n_servers == cfg.launcher.trainer_nproc == 4
    servers = plan.server_specs(cfg, [30001, 30002, 30003, 30004])
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in servers] == ["0", "1", "2", "3"]
    assert plan.trainer_gpu_offset(cfg, 4) == 0  # torchrun ranks 0..3 on GPUs 0..3: the same
    disaggregated = load_config(GPU, [], GRPOConfig)
    assert plan.trainer_gpu_offset(disaggregated, 4) == 4
    tp2 = load_config(GPU, ["launcher.colocate=true", "launcher.gpus_per_server=2"], GRPOConfig)
    with pytest.raises(plan.LaunchError, match="gpus_per_server to 1"):
        plan.server_specs(tp2, [1, 2, 3, 4])
