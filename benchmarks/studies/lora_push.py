"""LoRA versus full-weight pushes, side by side in one run.

    python -m benchmarks.studies.lora_push [--steps N] [--runs full-disk,full-broadcast,lora-disk,...]

Each run is the main job's async GRPO (``configs/toy_grpo.yaml``: tiny model from its SFT warm
start, one embedded server, one trainer, η = 2) through the local launcher, for the same number
of steps, one after the other, under ``{fileroot}/bench-lora-push/``:

- ``full-disk``: every weight saved as HF files, servers paused → ``/update_weights_from_disk``
  → continued.
- ``full-broadcast``: every weight broadcast over the weight-update group (the main job's way),
  also between pause and continue.
- ``lora-disk``: ``actor.lora`` (rank 16, alpha 32, all linear layers of the blocks; lr 2e-3,
  LoRA's usual ten times the full model's): only the adapter is written, and each version is
  loaded as ``<run>-v<k>`` beside the old ones with nothing paused
  (``arealite.weights.adapters``).
- ``lora-tensor``: the same adapter handed over in memory (``weight_update.type=tensor``: trainer
  rank 0 posts ``/load_lora_adapter_from_tensors`` by shared-memory reference), no file, no pause.
- ``lora-disk-pause``: the adapter through disk, but pause → load → continue around each load
  (``weight_update.lora_pause=true``, ``pause_mode`` abort): the path full weights take.

Figures per run: bytes pushed per update (the files of one update for disk pushes; the
parameters' bytes for a broadcast), seconds per push (median ``timeperf/weight_sync``: the
trainer's upload and the servers' load, end to end), seconds per step (mean
``timeperf/step``), the mean version span of trained trajectories (how far apart the versions of
one trajectory's tokens lie: above 0 when a push cut it), greedy held-out accuracy before and
after. Then the ratios against ``lora-disk``. The pushes alone, interleaved round by round on a
busy server: ``benchmarks/studies/lora_push_modes.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.warm_start import ensure_model

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs" / "toy_grpo.yaml")
EXPERIMENT = "bench-lora-push"
LORA = ["actor.lora.rank=16", "actor.lora.alpha=32", "actor.optimizer.lr=2e-3"]
RUNS: dict[str, list[str]] = {
    "full-disk": ["weight_update.type=disk"],
    "full-broadcast": ["weight_update.type=distributed"],
    "lora-disk": ["weight_update.type=disk", *LORA],
    "lora-tensor": ["weight_update.type=tensor", *LORA],
    "lora-disk-pause": ["weight_update.type=disk", "weight_update.lora_pause=true", *LORA],
}


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def model_bytes(model: Path) -> int:
    """Bytes of the model's weights (what a broadcast sends)."""
    return sum(f.stat().st_size for f in model.glob("*.safetensors"))


def adapter_bytes(model: Path) -> int:
    """Bytes of the rank-16 adapter's tensors (what an in-memory push hands over)."""
    import torch
    from transformers import AutoModelForCausalLM

    from arealite.api.config.actor import LoRAConfig
    from arealite.engine.lora import gather_adapter, wrap_with_lora

    m = wrap_with_lora(AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32),
                       LoRAConfig(rank=16, alpha=32))
    return sum(t.numel() * t.element_size() for t in gather_adapter(m).values())


def run(name: str, a: argparse.Namespace, model: Path, data: Path) -> dict[str, Any]:
    from arealite.launcher.local import main as launch

    out = Path(a.fileroot) / EXPERIMENT / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    argv = [CONFIG, f"actor.path={model}", f"train_dataset.path={data / 'train.jsonl'}",
            f"valid_dataset.path={data / 'valid.jsonl'}", f"cluster.fileroot={a.fileroot}",
            f"experiment_name={EXPERIMENT}", f"trial_name={name}", f"total_train_steps={a.steps}",
            f"evaluator.freq_steps={a.steps}", "stats_logger.tensorboard=false", *RUNS[name]]
    print(f"== {name}: arealite train {' '.join(argv)}", flush=True)
    t0 = time.monotonic()
    with open(out / "console.log", "w") as f, contextlib.redirect_stdout(f), \
            contextlib.redirect_stderr(f):
        code = launch(argv)
    if code != 0:
        tail = (out / "console.log").read_text().splitlines()[-30:]
        raise SystemExit(f"run {name} failed (exit {code}):\n" + "\n".join(tail))
    rows = [json.loads(ln) for ln in (out / "logs" / "metrics.jsonl").read_text().splitlines()
            if ln.strip()]
    steps = [r for r in rows if r.get("step", 0) >= 1 and "timeperf/weight_sync" in r]
    evals = [r["eval/score"] for r in rows if "eval/score" in r]
    push = out / "weights" / "v1"
    if push.is_dir():
        size = folder_bytes(push)
    else:
        size = adapter_bytes(model) if name == "lora-tensor" else model_bytes(model)
    spans = [r["version_span/mean"] for r in steps if "version_span/mean" in r]
    return {
        "run": name, "wall_s": time.monotonic() - t0, "steps": len(steps),
        "push_bytes": size, "version_span": statistics.fmean(spans) if spans else 0.0,
        "push_s": statistics.median(r["timeperf/weight_sync"] for r in steps),
        "step_s": statistics.fmean(r["timeperf/step"] for r in steps),
        "eval_before": evals[0] if evals else None, "eval_after": evals[-1] if evals else None,
    }


def report(results: list[dict[str, Any]]) -> None:
    print("\n| run | bytes per push | s per push (median) | s per step (mean) | version span "
          "(mean) | held-out acc. before -> after | wall s |\n|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['run']} | {r['push_bytes'] / 1e6:.3f} MB | {r['push_s']:.4f} | "
              f"{r['step_s']:.3f} | {r['version_span']:.4f} | {r['eval_before']:.3f} -> "
              f"{r['eval_after']:.3f} | {r['wall_s']:.0f} |")
    by = {r["run"]: r for r in results}
    lora = by.get("lora-disk")
    if lora is None:
        return
    for full in ("full-disk", "full-broadcast", "lora-tensor", "lora-disk-pause"):
        if full in by:
            f = by[full]
            print(f"\n{full} / lora-disk: bytes per push {f['push_bytes'] / lora['push_bytes']:.1f}x, "
                  f"seconds per push {f['push_s'] / lora['push_s']:.2f}x, "
                  f"seconds per step {f['step_s'] / lora['step_s']:.2f}x")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20, help="trainer steps per run")
    ap.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated subset of {list(RUNS)}")
    ap.add_argument("--fileroot", default="outputs")
    a = ap.parse_args(argv)
    names = [n for n in a.runs.split(",") if n]
    bad = [n for n in names if n not in RUNS]
    if bad:
        ap.error(f"unknown runs {bad}; choose from {list(RUNS)}")
    model, data = ensure_model(Path(a.fileroot))
    report([run(n, a, model, data) for n in names])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
