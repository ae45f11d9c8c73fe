"""tinker-cookbook's RL recipe (``tinker_cookbook.recipes.math_rl.train``, its ``arithmetic``
environment), unchanged, against a local ``arealite tinker-server``; then its reward step by step.

This script only starts what the recipe talks to and reads what it wrote: one embedded server
with LoRA adapters on (``servers.launch_server``), the Tinker service over it, then the recipe
as ``python -m tinker_cookbook.recipes.math_rl.train`` with its own command-line options (every
argument after ``--`` goes to it as is), and at the end the recipe's ``metrics.jsonl``.

    python examples/tinker_cookbook/arithmetic_rl.py --model DIR --out DIR [--rank R] \\
        -- renderer_name=qwen3_instruct group_size=4 groups_per_batch=8 max_steps=20 ...

``--model`` is a local HF model directory (SmolLM2-135M-Instruct: ``arealite import-smollm2``).
The recipe needs ``tinker`` and ``tinker-cookbook`` importable (docs/tinker.md lists them); its
``model_name``, ``base_url``, ``lora_rank`` and ``log_path`` are set here. docs/tinker.md has the
measured run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

KEY = "tml-cookbook-local"
SHOWN = ("env/all/reward/total", "env/all/correct", "env/all/format")


def reward_table(metrics: Path) -> list[str]:
    """One line per training step of the recipe's ``metrics.jsonl``: its mean reward and the
    correct-answer and format rates its environment logs."""
    lines = ["batch  " + "  ".join(f"{k:>20s}" for k in SHOWN)]
    for row in map(json.loads, metrics.read_text().splitlines()):
        if "env/all/reward/total" not in row:
            continue
        lines.append(f"{row.get('progress/batch', '?'):>5}  " + "  ".join(
            f"{row[k]:20.4f}" if k in row else f"{'-':>20s}" for k in SHOWN))
    return lines


def _wait_for(log: Path, text: str, proc: subprocess.Popen, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        if text in log.read_text(errors="replace"):
            return
        time.sleep(0.5)
    raise RuntimeError(f"{proc.args[2:4]} did not start:\n{log.read_text()[-3000:]}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, recipe = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv \
        else (argv, [])
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="local HF model directory")
    p.add_argument("--out", required=True, help="logs, the service's files, the recipe's log")
    p.add_argument("--rank", type=int, default=8, help="LoRA rank (the recipe's lora_rank)")
    p.add_argument("--service", nargs="*", default=[], metavar="KEY=VALUE",
                   help="overrides of configs/tinker/tiny.yaml for the service, e.g. "
                   "model.max_tokens_per_mb=1024 (smaller micro-batches, less memory)")
    args = p.parse_args(ours)

    from arealite.utils.network import LOOPBACK, find_free_port, wait_http_ok

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TINKER_TELEMETRY": "0"}
    procs: list[subprocess.Popen] = []

    def start(cmd: list[str], log: Path) -> subprocess.Popen:
        with open(log, "w") as f:
            procs.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                          start_new_session=True))
        return procs[-1]

    try:
        sport, tport = find_free_port(), find_free_port()
        server = start([sys.executable, "-m", "servers.launch_server", "--model-path", args.model,
                        "--host", LOOPBACK, "--port", str(sport), "--enable-lora",
                        "--max-lora-rank", str(args.rank), "--num-threads", "1"],
                       out / "server.log")
        if not wait_http_ok(f"http://{LOOPBACK}:{sport}/health", 600,
                            alive=lambda: server.poll() is None):
            raise RuntimeError("the server did not start:\n"
                               + (out / "server.log").read_text()[-3000:])
        service = start([sys.executable, "-m", "arealite.cli.main", "tinker-server",
                         "configs/tinker/tiny.yaml", f"model.path={args.model}",
                         f"rollout.server_addrs=[{LOOPBACK}:{sport}]",
                         f"fileroot={out / 'service'}", f"port={tport}", f"api_key={KEY}",
                         *args.service],
                        out / "service.log")
        _wait_for(out / "service.log", "tinker service at", service, 600)
        log_path = out / "recipe"
        cmd = [sys.executable, "-m", "tinker_cookbook.recipes.math_rl.train",
               f"model_name={args.model}", f"base_url=http://{LOOPBACK}:{tport}",
               f"lora_rank={args.rank}", f"log_path={log_path}",
               "behavior_if_log_dir_exists=delete", *recipe]
        print("$", " ".join(cmd), flush=True)
        t0 = time.monotonic()
        code = subprocess.run(cmd, env={**env, "TINKER_API_KEY": KEY}).returncode
        print(f"recipe exit status {code} after {time.monotonic() - t0:.0f} s", flush=True)
    finally:
        for proc in reversed(procs):
            try:
                os.killpg(proc.pid, 15)
                proc.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(proc.pid, 9)
    metrics = log_path / "metrics.jsonl"
    if metrics.is_file():
        print("\n".join(reward_table(metrics)))
    return code


if __name__ == "__main__":
    sys.exit(main())
