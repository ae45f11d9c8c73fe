"""EleutherAI ``lm-eval`` tasks against the run's own servers, as part of the evaluator.

``lm-eval`` runs in its own virtualenv (``make setup-lmeval``: it pins packages the main one
does not carry), as a subprocess with its ``local-completions`` client pointed at one server's
``/v1/completions``: generation tasks use the completion text, log-likelihood (multiple-choice)
tasks the prompt log-probs that ``echo`` + ``logprobs`` return. The scores come back from its
results file as ``eval/lm_eval/<task>/<metric>``, logged with the run's other eval stats.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import tempfile
from typing import Any

from arealite.api.config.run import LMEvalConfig


def lm_eval_command(
    cfg: LMEvalConfig, address: str, tokenizer_path: str, out_dir: str
) -> list[str]:
    """The ``lm_eval`` command line for ``cfg`` against the server at ``address``."""
    model_args = {
        "model": "policy",
        "base_url": f"http://{address}/v1/completions",
        "tokenizer_backend": "huggingface",
        "tokenizer": tokenizer_path,
        "tokenized_requests": "True",
        "num_concurrent": str(cfg.num_concurrent),
        "max_retries": "3",
    }
    cmd = [
        cfg.python,
        "-m",
        "lm_eval",
        "--model",
        "local-completions",
        "--model_args",
        ",".join(f"{k}={v}" for k, v in model_args.items()),
        "--tasks",
        ",".join(cfg.tasks),
        "--output_path",
        out_dir,
        "--log_samples",
    ]
    if cfg.include_path:
        cmd += ["--include_path", cfg.include_path]
    if cfg.limit is not None:
        cmd += ["--limit", str(cfg.limit)]
    if cfg.num_fewshot is not None:
        cmd += ["--num_fewshot", str(cfg.num_fewshot)]
    return cmd


def read_results(out_dir: str) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """(``eval/lm_eval/<task>/<metric>`` -> value, the logged samples) of an ``lm_eval`` run."""
    files = sorted(glob.glob(os.path.join(out_dir, "**", "results_*.json"), recursive=True))
    if not files:
        raise RuntimeError(f"lm_eval wrote no results file under {out_dir}")
    with open(files[-1]) as f:
        results = json.load(f)["results"]
    metrics = {}
    for task, vals in results.items():
        for key, v in vals.items():
            name = key.split(",")[0]  # "acc,none" -> "acc"
            if isinstance(v, (int, float)) and not isinstance(v, bool) and name != "alias":
                metrics[f"eval/lm_eval/{task}/{name}"] = float(v)
    samples = []
    for path in sorted(glob.glob(os.path.join(out_dir, "**", "samples_*.jsonl"), recursive=True)):
        with open(path) as f:
            samples += [json.loads(line) for line in f if line.strip()]
    return metrics, samples


def run_lm_eval(
    cfg: LMEvalConfig,
    addresses: list[str],
    tokenizer_path: str,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Run ``cfg.tasks`` against the first server; raises ``RuntimeError`` with lm-eval's
    output tail when it fails."""
    if not addresses:
        raise RuntimeError("lm-eval tasks need a server address; the eval engine has none")
    with tempfile.TemporaryDirectory(prefix="lm_eval_") as out_dir:
        proc = subprocess.run(
            lm_eval_command(cfg, addresses[0], tokenizer_path, out_dir),
            capture_output=True,
            text=True,
            timeout=cfg.timeout,
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"lm_eval exited with {proc.returncode}:\n{(proc.stdout + proc.stderr)[-3000:]}"
            )
        return read_results(out_dir)
