"""The planner's table for docs/memory_planner.md: Qwen3 shapes x tokens per micro-batch x
GPUs, one training recipe, per-rank peak and whether it fits an H100 80GB (usable: 90%).

Recipe (the long-reasoning GPU config's): fp32 master weights and AdamW state, bf16 compute
(FSDP2 mixed precision, fp32 reduction), every decoder layer recomputed in backward, the fused
head, flash-attn varlen (planned as one causal segment without its mask), two micro-batches of
one sequence each per step. Cells are planned in the order of ``cells`` and appended to
benchmarks/results/memplan/table.jsonl as they finish (``--resume`` skips planned ones).
No GPU has checked these predictions.

    python -m benchmarks.micro.memory_plan_table [--models qwen3-0.6b ...] [--resume]
"""

from __future__ import annotations

import argparse
import json
import sys

from benchmarks.harness.paths import results_dir
from benchmarks.micro.memory_plan import in_subprocess

GIB = 1 << 30
MODELS = ("qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b")
TOKENS = (8192, 32768, 65536, 131072)
WORLDS = (8, 1, 2, 4)  # the ends of the range first


def cell(point: dict) -> dict:
    from arealite.api.config.actor import MixedPrecisionConfig, PPOActorConfig
    from arealite.memplan.model_shapes import shape_config
    from arealite.memplan.trainer_memory import predict_trainer

    cfg = PPOActorConfig(path="unused", dtype="float32", max_tokens_per_mb=point["tokens"],
                         mixed_precision=MixedPrecisionConfig(param_dtype="bfloat16",
                                                              reduce_dtype="float32"),
                         gradient_checkpointing=True, logprob_head="fused",
                         attn_impl="flash_attention_2", shared_prompt_packing=False)
    r = predict_trainer(cfg, shape_config(point["model"]), point["world"])
    return {"peak": r.peak, "breakdown": r.breakdown, "seconds": r.seconds}


def cells(models: list[str]) -> list[tuple[str, int, int]]:
    """(model, tokens, GPUs) in the order planned: the longest micro-batch on the most GPUs
    first, then one GPU, then the rest (a run cut short has the corners of the table)."""
    first = [(m, TOKENS[-1], 8) for m in models] + [(m, TOKENS[1], 8) for m in models]
    first += [(m, TOKENS[0], 1) for m in models] + [(m, TOKENS[-1], 1) for m in models]
    rest = [(m, t, w) for w in WORLDS for m in models for t in TOKENS]
    return first + [c for c in rest if c not in first]


def markdown(rows: list[dict]) -> str:
    """The table of docs/memory_planner.md: a row per model and token count, a column per GPU
    count; each cell the per-rank peak in GiB, marked when over an H100 80GB's usable 72 GiB;
    "-" where not planned."""
    got = {(r["model"], r["tokens"], r["world"]): r for r in rows}
    worlds = sorted({r["world"] for r in rows}) or [1, 2, 4, 8]
    lines = ["| model | tokens/micro-batch | " + " | ".join(f"{w} x H100" for w in worlds) + " |",
             "|---|---:|" + "---:|" * len(worlds)]
    for model in MODELS:
        for tokens in TOKENS:
            cells = []
            for w in worlds:
                r = got.get((model, tokens, w))
                cells.append("-" if r is None else f"{r['peak'] / GIB:.1f}"
                             + ("" if r["fits_h100_80gb"] else " (over)"))
            if any(c != "-" for c in cells):
                lines.append(f"| {model} | {tokens:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--markdown", action="store_true", help="print the table of the planned "
                    "cells and exit")
    a = ap.parse_args(argv)
    out = results_dir("memplan")
    if a.markdown:
        path = out / "table.jsonl"
        rows = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
        sys.stdout.write(markdown(rows))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    path = out / "table.jsonl"
    done = set()
    if a.resume and path.exists():
        done = {(r["model"], r["tokens"], r["world"])
                for r in map(json.loads, path.read_text().splitlines())}
    elif path.exists():
        path.unlink()
    usable = 80 * GIB * 0.9
    for model, tokens, world in cells(a.models):
        if (model, tokens, world) in done:
            continue
        pt = dict(model=model, tokens=tokens, world=world)
        r = in_subprocess("cell", pt, "benchmarks.micro.memory_plan_table")
        row = {**pt, **r, "fits_h100_80gb": r["peak"] <= usable}
        with path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(f"{model:<11} {tokens:>7} x{world} {r['peak'] / GIB:7.1f} GiB "
              f"{'fits' if row['fits_h100_80gb'] else 'over'} ({r['seconds']:.0f} s)",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
