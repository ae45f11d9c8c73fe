"""Commands the launcher builds, and its ``--dry-run`` (nothing is started here)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest
import yaml

from arealite.api.config.experiment import GRPOConfig, SFTConfig
from arealite.api.config.loader import load_config
from arealite.launcher import plan
from arealite.launcher.local import main
from arealite.launcher.plan import LaunchError
from tests.support.min_assets import min_assets

REPO = Path(__file__).resolve().parents[2]
GPU = str(REPO / "configs" / "gsm8k_grpo_gpu.yaml")


def _split(line: str) -> tuple[dict[str, str], list[str]]:
    words = shlex.split(line)
    env = {}
    while words and "=" in words[0] and not words[0].startswith("-"):
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    return env, words


def test_dry_run_of_the_gpu_config_prints_config_and_exact_commands(capsys):
    assert main([GPU, "--dry-run"]) == 0
    out = capsys.readouterr().out
    cfg_text, _, cmds = out.partition("# commands (each in its own process group):\n")
    resolved = yaml.safe_load(cfg_text)
    assert GRPOConfig.model_validate(resolved) == load_config(GPU)
    lines = [ln for ln in cmds.splitlines() if ln.strip()]
    assert len(lines) == 5  # 4 real SGLang servers + torchrun
    ports = []
    for i, line in enumerate(lines[:4]):
        env, cmd = _split(line)
        assert env["CUDA_VISIBLE_DEVICES"] == str(i) and env["OMP_NUM_THREADS"] == "1"
        assert cmd[:3] == [sys.executable, "-m", "sglang.launch_server"]
        args = dict(zip(cmd[3::2], cmd[4::2]))
        assert args["--model-path"] == "Qwen/Qwen2.5-1.5B-Instruct"
        assert args["--weight-version"] == "0" and args["--dtype"] == "bfloat16"
        assert args["--random-seed"] == str(1 + i) and args["--mem-fraction-static"] == "0.8"
        assert args["--context-length"] == "4096" and args["--host"] == "127.0.0.1"
        ports.append(args["--port"])
    assert len(set(ports)) == 4
    env, cmd = _split(lines[4])
    assert env["AREAL_LLM_SERVER_ADDRS"] == ",".join(f"127.0.0.1:{p}" for p in ports)
    assert env["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert Path(cmd[0]).name == "torchrun" or cmd[1:3] == ["-m", "torch.distributed.run"]
    i = cmd.index("--nproc-per-node")
    assert cmd[i + 1] == "4" and cmd[cmd.index("--master-addr") + 1] == "127.0.0.1"
    # picked together with the servers' ports, so never one of them
    assert cmd[cmd.index("--master-port") + 1] not in ports
    assert cmd[cmd.index("-m") + 1:] == ["arealite.trainer.grpo", GPU]


def test_dry_run_through_the_arealite_cli(capsys):
    from arealite.cli.main import main as cli

    assert cli(["train", GPU, "launcher.n_servers=2", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("sglang.launch_server") == 2
    assert "arealite.trainer.grpo " + GPU + " launcher.n_servers=2" in out


def test_dry_run_of_sft_starts_only_a_trainer(capsys, tmp_path):
    assert main([str(REPO / "configs" / "toy_sft.yaml"), "launcher.trainer_nproc=2",
                 *min_assets(tmp_path, "model.path"), "--dry-run"]) == 0
    cmds = capsys.readouterr().out.split("# commands")[1]
    assert "launch_server" not in cmds and "-m arealite.trainer.sft" in cmds
    assert "--nproc-per-node 2" in cmds and "AREAL_LLM_SERVER_ADDRS" not in cmds


def test_bad_config_and_impossible_launch_exit_2(capsys, monkeypatch):
    monkeypatch.delenv(plan.ADDRS_ENV, raising=False)
    assert main([GPU, "launcher.n_servrs=2", "--dry-run"]) == 2
    assert "did you mean: n_servers" in capsys.readouterr().err
    assert main([GPU, "launcher.mode=trainer_only", "--dry-run"]) == 2
    assert "rollout.server_addrs" in capsys.readouterr().err
    assert main([str(REPO / "configs" / "toy_sft.yaml"), "launcher.mode=server_only"]) == 2
    assert "server_only is invalid" in capsys.readouterr().err
    assert main([str(REPO / "no_such.yaml"), "--dry-run"]) == 2


def _grpo(**kw) -> GRPOConfig:
    return GRPOConfig.model_validate({"actor": {"path": "/m"}, **kw})


def test_server_flags_follow_the_sglang_section():
    cfg = _grpo(servers={"api_key": "s3cr3t", "admin_api_key": "adm1n", "max_running_requests": 8,
                        "tp_size": 2, "enable_metrics": True, "skip_tokenizer_init": True,
                        "device": "cpu", "random_seed": None, "extra_args": ["--foo", "1"],
                        "model_path": "/served"},
                launcher={"gpus_per_server": 2, "server_threads": 3})
    (spec,) = plan.server_specs(cfg, [1234], environ={})
    cmd = spec.cmd
    assert cmd[cmd.index("--model-path") + 1] == "/served"
    # the embedded server reads its keys from the environment: never on its command line
    assert "--api-key" not in cmd and "--admin-api-key" not in cmd and "--random-seed" not in cmd
    assert cmd[cmd.index("--tp-size") + 1] == "2" and cmd[cmd.index("--device") + 1] == "cpu"
    assert "--enable-metrics" in cmd and "--skip-tokenizer-init" in cmd and cmd[-2:] == ["--foo", "1"]
    assert spec.env == {"OMP_NUM_THREADS": "3", "PYTHONUNBUFFERED": "1",
                        "CUDA_VISIBLE_DEVICES": "0,1", "AREALITE_API_KEY": "s3cr3t",
                        "AREALITE_ADMIN_API_KEY": "adm1n"}
    shown = spec.shell()
    assert "s3cr3t" not in shown and "adm1n" not in shown and "AREALITE_API_KEY=***" in shown
    assert "s3cr3t" in spec.shell(mask_secrets=False)
    assert spec.addr == "127.0.0.1:1234"
    # real SGLang reads keys only from flags: there they go, masked when printed
    cfg.launcher.server_backend = "sglang"
    (spec,) = plan.server_specs(cfg, [1234], environ={})
    assert spec.cmd[spec.cmd.index("--api-key") + 1] == "s3cr3t"
    assert "s3cr3t" not in spec.shell() and "--api-key '***'" in spec.shell()


def test_keys_reach_the_trainer_by_environment_and_never_a_printed_line(monkeypatch, capsys):
    cfg = _grpo(servers={"admin_api_key": "adm1n"})
    t = plan.trainer_spec(cfg, "c.yaml", [], 99, ["h:1"], environ={"AREALITE_API_KEY": "k3y"})
    assert t.env["AREALITE_API_KEY"] == "k3y" and t.env["AREALITE_ADMIN_API_KEY"] == "adm1n"
    assert "k3y" not in t.shell() and "adm1n" not in t.shell()
    monkeypatch.delenv(plan.ADDRS_ENV, raising=False)
    monkeypatch.setenv("AREALITE_API_KEY", "envk3y")
    assert main([GPU, "servers.api_key=cfgk3y", "servers.admin_api_key=adm1n", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "cfgk3y" not in out and "adm1n" not in out and "envk3y" not in out
    assert "api_key: '***'" in out


def test_gpus_map_through_an_inherited_cuda_visible_devices():
    cfg = _grpo(launcher={"n_servers": 2, "gpus_per_server": 1, "trainer_nproc": 2})
    env = {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    specs = plan.server_specs(cfg, [1, 2], environ=env)
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in specs] == ["4", "5"]
    t = plan.trainer_spec(cfg, "c.yaml", [], 99, [s.addr for s in specs],
                          gpu_offset=plan.trainer_gpu_offset(cfg, 2), environ=env)
    assert t.env["CUDA_VISIBLE_DEVICES"] == "6,7"
    with pytest.raises(LaunchError, match="CUDA_VISIBLE_DEVICES"):
        plan.trainer_spec(cfg, "c.yaml", [], 99, None, gpu_offset=3, environ=env)


def test_cpu_servers_leave_gpus_alone_and_need_a_model():
    cfg = _grpo()
    (spec,) = plan.server_specs(cfg, [5], environ={})
    assert "CUDA_VISIBLE_DEVICES" not in spec.env and plan.trainer_gpu_offset(cfg, 1) is None
    with pytest.raises(LaunchError, match="no model"):
        plan.server_specs(GRPOConfig(), [5], environ={})
    with pytest.raises(LaunchError, match="tp_size"):
        plan.server_specs(_grpo(servers={"tp_size": 2}, launcher={"gpus_per_server": 1}), [5])
    with pytest.raises(LaunchError, match="colocate_servers=recreate is a co-located"):
        plan.server_specs(_grpo(launcher={"colocate_servers": "recreate"}), [5], environ={})


def test_trainer_only_addresses():
    cfg = _grpo()
    assert plan.trainer_addrs(cfg, {plan.ADDRS_ENV: "h1:1, h2:2,"}) == ["h1:1", "h2:2"]
    cfg2 = _grpo(rollout={"server_addrs": ["a:10"]})
    assert plan.trainer_addrs(cfg2, {plan.ADDRS_ENV: "h1:1"}) == ["a:10"]  # config wins
    with pytest.raises(LaunchError, match="not host:port"):
        plan.trainer_addrs(cfg, {plan.ADDRS_ENV: "h1:abc"})
    with pytest.raises(LaunchError, match="needs server addresses"):
        plan.trainer_addrs(cfg, {})


def test_entry_module_and_bind_address():
    assert plan.entry_module(_grpo()) == "arealite.trainer.grpo"
    assert plan.entry_module(SFTConfig()) == "arealite.trainer.sft"
    assert plan.entry_module(_grpo(launcher={"entry_module": "my.mod"})) == "my.mod"
    (spec,) = plan.server_specs(_grpo(launcher={"server_host": "0.0.0.0"}), [7], environ={})
    assert spec.cmd[spec.cmd.index("--host") + 1] == "0.0.0.0"
    assert not spec.addr.startswith("0.0.0.0") and spec.addr.endswith(":7")


def test_ray_launcher_help_and_clear_error_without_ray(capsys, monkeypatch):
    from arealite.launcher import ray as ray_launcher

    with pytest.raises(SystemExit) as e:
        ray_launcher.main(["--help"])
    assert e.value.code == 0 and "Ray" in capsys.readouterr().out
    monkeypatch.setitem(sys.modules, "ray", None)  # as on machines without ray
    assert ray_launcher.main([GPU]) == 2
    assert "needs ray" in capsys.readouterr().err
    assert ray_launcher.main([str(REPO / "configs" / "toy_sft.yaml")]) == 2
    assert "kind must be grpo" in capsys.readouterr().err


def test_auto_threads_split_the_cores():
    from arealite.api.config.launcher import LauncherConfig
    from arealite.launcher.plan import thread_counts

    assert thread_counts(LauncherConfig(), cores=16) == (1, 1)  # explicit: as configured
    auto = {"server_threads": 0, "trainer_threads": 0}
    assert thread_counts(LauncherConfig(**auto), cores=2) == (1, 1)  # the main job here
    assert thread_counts(LauncherConfig(**auto), cores=16) == (8, 8)
    assert thread_counts(LauncherConfig(n_servers=4, trainer_nproc=2, **auto), cores=16) == (2, 4)
    assert thread_counts(LauncherConfig(n_servers=3, server_threads=2, trainer_threads=0),
                         cores=16) == (2, 10)
    assert thread_counts(LauncherConfig(mode="trainer_only", n_servers=4, **auto), cores=8) == (8, 8)
    assert thread_counts(LauncherConfig(n_servers=8, trainer_nproc=8, **auto), cores=2) == (1, 1)


def test_a_server_started_again_gets_a_new_seed():
    from arealite.launcher.local import _reseeded
    from arealite.launcher.plan import ProcSpec

    spec = ProcSpec("server1", ["python", "-m", "servers.launch_server", "--random-seed", "8",
                                "--port", "1"], {"A": "1"}, "127.0.0.1:1")
    again = _reseeded(spec, 2)
    assert again.cmd[again.cmd.index("--random-seed") + 1] == "10" and spec.cmd[4] == "8"
    assert (again.name, again.env, again.addr) == (spec.name, spec.env, spec.addr)
    unseeded = ProcSpec("server0", ["python", "-m", "sglang.launch_server"])
    assert _reseeded(unseeded, 3).cmd == unseeded.cmd
