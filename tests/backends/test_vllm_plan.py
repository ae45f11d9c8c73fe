"""``launcher.server_backend=vllm``: vLLM's command line from the ``sglang`` section, and the
models vLLM cannot train with refused at launch with the reason."""

from __future__ import annotations

import json

import pytest

from arealite.api.config.experiment import GRPOConfig
from arealite.backends.vllm import server_command as vllm_server
from arealite.launcher import plan


def _grpo(model: str, **kw) -> GRPOConfig:
    return GRPOConfig.model_validate({"actor": {"path": model},
                                      "launcher": {"server_backend": "vllm", **kw.pop("launcher", {})},
                                      **kw})


def _model(tmp_path, **cfg) -> str:
    (tmp_path / "config.json").write_text(json.dumps(
        {"hidden_size": 64, "num_attention_heads": 2, "tie_word_embeddings": False, **cfg}))
    return str(tmp_path)


def test_vllm_command_maps_the_sglang_section(tmp_path):
    cfg = _grpo(_model(tmp_path), servers={"api_key": "s3cr3t", "context_length": 512,
                                          "max_running_requests": 8, "random_seed": 5,
                                          "extra_args": ["--foo"]},
                launcher={"n_servers": 2, "server_threads": 2})
    env = {plan_env: "/venv/bin/python" for plan_env in [vllm_server.VLLM_PYTHON_ENV]}
    specs = plan.server_specs(cfg, [11, 12], environ=env)
    cmd = specs[1].cmd
    assert cmd[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    flag = {a: cmd[i + 1] for i, a in enumerate(cmd[:-1]) if a.startswith("--")}
    assert flag["--model"] == str(tmp_path) and flag["--port"] == "12" and flag["--seed"] == "6"
    assert flag["--max-model-len"] == "512" and flag["--max-num-seqs"] == "8"
    assert flag["--gpu-memory-utilization"] == "0.1"  # CPU: vLLM's default refuses to start
    assert flag["--logprobs-mode"] == "processed_logprobs" and "--enable-scale-out" in cmd
    assert flag["--api-key"] == "s3cr3t" and "s3cr3t" not in specs[1].shell()
    assert cmd[-1] == "--foo" and specs[1].addr == "127.0.0.1:12"
    assert specs[1].env["VLLM_SERVER_DEV_MODE"] == "1" and specs[1].env["OMP_NUM_THREADS"] == "2"
    assert specs[1].env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"


def test_a_lora_run_lets_vllm_load_adapters_at_run_time(tmp_path):
    cfg = _grpo(_model(tmp_path), actor={"path": str(tmp_path), "lora": {"rank": 16}},
                servers={"extra_args": ["--foo"]})
    (spec,) = plan.server_specs(cfg, [11], environ={})
    flag = {a: spec.cmd[i + 1] for i, a in enumerate(spec.cmd[:-1]) if a.startswith("--")}
    assert "--enable-lora" in spec.cmd and flag["--max-lora-rank"] == "16"
    assert flag["--max-loras"] == "8" and spec.cmd[-1] == "--foo"
    assert spec.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"


def test_gpu_servers_keep_vllms_memory_default(tmp_path):
    cfg = _grpo(_model(tmp_path), launcher={"gpus_per_server": 1})
    (spec,) = plan.server_specs(cfg, [11], environ={})
    assert "--gpu-memory-utilization" not in spec.cmd and "VLLM_CPU_OMP_THREADS_BIND" not in spec.env
    assert spec.env["CUDA_VISIBLE_DEVICES"] == "0"
    # GPU servers take distributed updates over vLLM's NCCL weight transfer; CPU ones cannot
    at = spec.cmd.index("--weight-transfer-config")
    assert json.loads(spec.cmd[at + 1]) == {"backend": "nccl"}
    (cpu,) = plan.server_specs(_grpo(_model(tmp_path)), [11], environ={})
    assert "--weight-transfer-config" not in cpu.cmd


@pytest.mark.parametrize("cfg, why", [
    ({"hidden_size": 64, "num_attention_heads": 4}, "head_dim 16"),
    ({"head_dim": 48}, "head_dim 48"),
    ({"tie_word_embeddings": True}, "tie_word_embeddings"),
])
def test_models_vllm_cannot_train_with_are_a_launch_error(tmp_path, cfg, why):
    with pytest.raises(plan.LaunchError, match=why):
        plan.server_specs(_grpo(_model(tmp_path, **cfg)), [11], environ={})


def test_head_dim_is_only_a_cpu_limit(tmp_path):
    cfg = _grpo(_model(tmp_path, head_dim=48), launcher={"gpus_per_server": 1})
    assert plan.server_specs(cfg, [11], environ={})
