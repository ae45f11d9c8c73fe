"""The reward-model pool the launcher starts (``launcher.reward_model_servers``): its commands,
GPUs and the trainer's ``AREAL_RM_SERVER_ADDRS`` (nothing is started here; the integration run
is tests/observe/test_observers.py)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from pydantic import ValidationError

from arealite.api.config.experiment import GRPOConfig
from arealite.api.reward_model_api import RM_ADDRS_ENV
from arealite.launcher import plan
from arealite.launcher import reward_model_servers as rm
from arealite.launcher.local import LocalLauncher, main
from arealite.launcher.plan import LaunchError
from tests.support.min_assets import min_assets

REPO = Path(__file__).resolve().parents[2]
RM = {"model_path": "/rm", "n_servers": 2, "threads": 3, "extra_args": ["--foo", "1"]}


def _grpo(launcher: dict | None = None, **kw) -> GRPOConfig:
    return GRPOConfig.model_validate({"actor": {"path": "/m"}, "reward_model": {},
                                      "launcher": {"reward_model_servers": RM, **(launcher or {})},
                                      **kw})


def test_local_mode_starts_the_pool_and_hands_its_addresses_to_the_trainer():
    launcher = LocalLauncher(_grpo({"n_servers": 2}), "c.yaml", [])
    servers, trainer = launcher.plan()
    assert [s.name for s in servers] == ["server0", "server1", "rm_server0", "rm_server1"]
    rms = servers[2:]
    for s in rms:
        assert s.cmd[1:3] == ["-m", "servers.launch_server"] and "--is-embedding" in s.cmd
        assert s.cmd[s.cmd.index("--model-path") + 1] == "/rm" and s.cmd[-2:] == ["--foo", "1"]
        assert s.env["OMP_NUM_THREADS"] == "3"
    ports = {s.addr for s in servers} | {trainer.cmd[trainer.cmd.index("--master-port") + 1]}
    assert len(ports) == 5  # no port twice
    assert trainer.env[RM_ADDRS_ENV] == ",".join(s.addr for s in rms)
    assert trainer.env[plan.ADDRS_ENV] == ",".join(s.addr for s in servers[:2])


def test_trainer_only_starts_none_and_server_only_prints_both_pools(tmp_path, capsys):
    servers, trainer = LocalLauncher(
        _grpo({"mode": "trainer_only"}, rollout={"server_addrs": ["h:1"]}), "c.yaml", []).plan()
    assert servers == [] and RM_ADDRS_ENV not in trainer.env
    servers, trainer = LocalLauncher(_grpo({"mode": "server_only"}), "c.yaml", []).plan()
    assert trainer is None and sum(rm.is_rm_server(s.name) for s in servers) == 2
    assert rm.addrs_line(servers[1:]) == f"{RM_ADDRS_ENV}={servers[1].addr},{servers[2].addr}"


def test_gpus_follow_the_generation_servers_and_sglang_gets_key_flags():
    cfg = _grpo({"n_servers": 2, "gpus_per_server": 1, "trainer_nproc": 2,
                 "reward_model_servers": {**RM, "backend": "sglang"}},
                servers={"api_key": "k3y"})
    servers, trainer = LocalLauncher(cfg, "c.yaml", []).plan()
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in servers] == ["0", "1", "2", "3"]
    assert trainer.env["CUDA_VISIBLE_DEVICES"] == "4,5"
    rms = servers[2:]
    assert rms[0].cmd[2] == "sglang.launch_server"
    assert rms[0].cmd[rms[0].cmd.index("--api-key") + 1] == "k3y"
    assert "k3y" not in rms[0].shell()


def test_misconfigurations_are_clear_errors(capsys):
    with pytest.raises(ValidationError, match="set reward_model"):
        GRPOConfig.model_validate({"actor": {"path": "/m"},
                                   "launcher": {"reward_model_servers": RM}})
    with pytest.raises(ValidationError, match="model_path"):
        _grpo({"reward_model_servers": {"n_servers": 1}})
    with pytest.raises(LaunchError, match="drop one of the two"):
        LocalLauncher(_grpo(reward_model={"server_addrs": ["h:1"]}), "c.yaml", []).plan()
    # through the CLI: exit 2, one line
    cfg = str(REPO / "configs" / "toy_grpo.yaml")
    assert main([cfg, "launcher.reward_model_servers.model_path=/rm", "--dry-run"]) == 2
    assert "set reward_model" in capsys.readouterr().err


def test_dry_run_prints_the_pool(capsys, tmp_path):
    cfg = str(REPO / "configs" / "toy_grpo.yaml")
    assert main([cfg, "launcher.reward_model_servers.model_path=/rm", "reward_model={}",
                 *min_assets(tmp_path), "--dry-run"]) == 0
    cmds = capsys.readouterr().out.split("# commands")[1].splitlines()[1:]
    rm_line = next(c for c in cmds if "--is-embedding" in c)
    assert "/rm" in shlex.split(rm_line) and RM_ADDRS_ENV in cmds[-1]


def test_the_ray_launcher_refuses_it_with_one_line(capsys):
    from arealite.launcher import ray as ray_launcher

    cfg = str(REPO / "configs" / "toy_grpo.yaml")
    assert ray_launcher.main([cfg, "launcher.reward_model_servers.model_path=/rm",
                              "reward_model={}"]) == 2
    assert "does not start a reward-model pool" in capsys.readouterr().err
