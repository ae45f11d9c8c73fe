"""The co-located job on one device: the main job (``arealite main-job``, toy arithmetic) with
``launcher.colocate=true``: the embedded server and the FSDP2 trainer take turns with the device,
weights pushed by reference (``weight_update.type: tensor``, CUDA IPC on a GPU), the server's
memory released and resumed around every training phase, the consistency gate after every push.

On CUDA the model is a ~180M-parameter Qwen2 (1024 wide, 16 layers) built from a config,
warm-started by SFT on the toy task (at most ``--sft-steps``), then ``--steps`` GRPO steps
(fewer when 120 s of training run out: ``total_train_seconds``);
the server runs bf16, the trainer bf16 compute over fp32 master weights. ``--device cpu
--quick``: the tiny model, two steps, the main job's SFT warm start (``outputs/assets`` when
``make run`` built it, else at most 60 SFT steps).

Figures (from the run's ``metrics.jsonl``): seconds per step by phase; the device memory the
server's release freed and its resume took back, against what was in use before the release,
and what the trainer's offload freed; the push (``timeperf/weight_upload``) against a
device-to-device copy of the same bytes; the gate's figures at step 0 and after each push and
the largest sampled-token log-prob gap; held-out accuracy at the start and the end.

    python -m benchmarks.gpu_check.colocated --device cuda [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.gpu_check.device_info import copy_seconds

ROOT = Path(__file__).resolve().parents[2]
# ~180M parameters: big enough that weights, not the CUDA context, dominate the memory figures
CUDA_SPEC = dict(
    hidden_size=1024,
    intermediate_size=2816,
    num_hidden_layers=16,
    num_attention_heads=16,
    num_key_value_heads=4,
)
CUDA_ARGS = [
    "device=cuda",
    "dist_backend=nccl",
    "servers.device=cuda",
    "servers.dtype=bfloat16",
    "launcher.gpus_per_server=1",
    "actor.mixed_precision.param_dtype=bfloat16",
    # the bf16 servers' checksums against the trainer's fp32 weights cast as the servers cast them
    "weight_update.checksum_dtype=bfloat16",
    "sft.device=cuda",
    "sft.dist_backend=nccl",
    "sft.model.mixed_precision.param_dtype=bfloat16",
    # the GRPO steps end early rather than the part's time limit ending the job
    "total_train_seconds=120",
]


def build_assets(assets: Path, device: str, quick: bool) -> None:
    """The main job's assets, with the bigger model on CUDA (the job builds the rest)."""
    from arealite.demo.tiny import TinyModelSpec, build_tiny_model

    if device == "cuda" and not quick:
        build_tiny_model(assets / "tiny_model", TinyModelSpec(**CUDA_SPEC))


def job_command(fileroot: Path, device: str, quick: bool, steps: int, sft_steps: int) -> list[str]:
    args = [
        f"cluster.fileroot={fileroot}",
        "trial_name=gpu_check",
        f"total_train_steps={steps}",
        f"evaluator.freq_steps={steps}",
        "evaluator.max_prompts=64",
        "launcher.colocate=true",
        "weight_update.consistency.every=1",
        f"sft.total_train_steps={sft_steps}",
    ]
    if device == "cuda":
        args += CUDA_ARGS
    return [sys.executable, "-m", "arealite.cli.main", "main-job", *args]


def _mean(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if key in r]
    return round(statistics.mean(vals), 4) if vals else None


def summarize(rows: list[dict], push_bytes: int, copy_s: float | None) -> dict:
    """The figures of one run's metrics rows (step 0: the initial evaluation)."""
    steps = [r for r in rows if r.get("step", 0) >= 1]
    acc = [(r["step"], r["eval/score"]) for r in rows if "eval/score" in r]
    phases = sorted(
        {k for r in steps for k in r if k.startswith("timeperf/")} - {"timeperf/train_elapsed"}
    )
    out: dict = {
        "steps": len(steps),
        "seconds_per_step": {k.split("/", 1)[1]: _mean(steps, k) for k in phases},
        "accuracy_start": acc[0][1] if acc else None,
        "accuracy_end": acc[-1][1] if len(acc) > 1 else None,
    }
    mem = {}
    for t in ("release_servers", "resume_servers", "offload_actor", "onload_actor"):
        for kind in ("freed_mib", "device_freed_mib", "device_used_before_mib"):
            v = _mean(steps, f"colocate/{t}_{kind}")
            if v is not None:
                mem[f"{t}_{kind}"] = v
    if mem.get("release_servers_device_used_before_mib"):
        mem["release_share_of_used"] = round(
            mem["release_servers_device_freed_mib"] / mem["release_servers_device_used_before_mib"],
            3,
        )
    out["memory"] = mem
    push = _mean(steps, "timeperf/weight_upload")
    out["push"] = {
        "bytes": push_bytes,
        "upload_s": push,
        "copy_s": copy_s,
        "upload_over_copy": round(push / copy_s, 2) if push and copy_s else None,
    }
    gate = [
        {"step": r["step"], **{k.split("/", 1)[1]: r[k] for k in r if k.startswith("consistency/")}}
        for r in steps
        if any(k.startswith("consistency/") for k in r)
    ]
    out["gate"] = gate  # step 1's row holds the worst of the step-0 check and step 1's push
    out["sampled_logprob_gap_max"] = max(
        (
            r["logprob_agreement/max_abs_diff"]
            for r in steps
            if "logprob_agreement/max_abs_diff" in r
        ),
        default=None,
    )
    return out


def model_bytes(model_dir: Path, device: str) -> int:
    """The bytes one push moves: every parameter in the servers' dtype."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        m = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    return sum(p.numel() for p in m.parameters()) * (2 if device == "cuda" else 4)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", choices=["cuda", "cpu"], required=True)
    ap.add_argument("--quick", action="store_true", help="tiny model, 2 steps")
    ap.add_argument("--steps", type=int, default=None, help="GRPO steps (20; quick: 2)")
    ap.add_argument(
        "--sft-steps",
        type=int,
        default=None,
        help="SFT warm start's step limit "
        "(300; quick: 60; it stops earlier at the main job's held-out accuracy)",
    )
    ap.add_argument(
        "--assets",
        default=None,
        help="reuse a main job's assets folder "
        "(tiny model, toy task, SFT warm start) instead of building them",
    )
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    steps = a.steps or (2 if a.quick else 20)
    sft_steps = a.sft_steps or (60 if a.quick else 300)
    built = ROOT / "outputs" / "assets"  # `make run`'s, reused by the CPU form as the studies do
    if a.assets is None and a.device == "cpu" and (built / "sft_model" / "config.json").is_file():
        a.assets = str(built)
    with tempfile.TemporaryDirectory(prefix="gpu_check_colo_") as d:
        root = Path(d)
        if a.assets:
            (root / "assets").symlink_to(Path(a.assets).resolve())
        else:
            build_assets(root / "assets", a.device, a.quick)
        cmd = job_command(root, a.device, a.quick, steps, sft_steps)
        print(" ".join(cmd), flush=True)
        t0 = time.monotonic()
        code = subprocess.run(cmd, cwd=ROOT).returncode
        wall = time.monotonic() - t0
        metrics = root / "toy-grpo" / "gpu_check" / "logs" / "metrics.jsonl"
        rows = (
            [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
            if metrics.is_file()
            else []
        )
        nbytes = (
            model_bytes(root / "assets" / "sft_model", a.device)
            if (root / "assets" / "sft_model" / "config.json").is_file()
            else 0
        )
        copy_s = copy_seconds(nbytes, a.device) if nbytes else None
        # the lines the trainer logged: the first check's (v0: step 0) and any failure's (later
        # passes are at debug; every check's figures are in the metrics: `gate`)
        tlog = metrics.with_name("trainer.log")
        text = tlog.read_text().splitlines() if tlog.is_file() else []
        checks = [
            ln.split("consistency_gate: ", 1)[-1] for ln in text if "consistency gate" in ln.lower()
        ]
    res = {
        "exit": code,
        "wall_s": round(wall, 1),
        **summarize(rows, nbytes, copy_s),
        "gate_checks": checks[:30],
    }
    print(json.dumps(res, indent=1), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 0 if code == 0 and res["steps"] >= 1 else 1


if __name__ == "__main__":
    sys.exit(main())
