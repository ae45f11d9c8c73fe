"""The planner's table for docs/benchmarks.md: Qwen3 shapes x tokens per micro-batch x H100s,
what fits an H100 80GB (usable: 90%) with which knobs, and the per-rank peak.

Recipe (the long-reasoning GPU config's): fp32 master weights and AdamW state, bf16 compute
(FSDP2 mixed precision, fp32 reduction), every decoder layer recomputed in backward, the fused
head, flash-attn varlen (planned as one causal segment without its mask), two micro-batches of
one sequence each per step. Where that does not fit, the knobs are tried in order: context
parallelism 2, 4, 8 (dividing the GPUs and the attention heads), then CPU offload at the
largest context parallelism tried; the first that fits is the cell's answer. Context
parallelism runs the segment kernel (flash-attn varlen is refused with it), so its plans hold
the kernel's [L, L] layout mask per micro-batch (built and moved to the device by the engine,
never read for causal sequences: 2 GiB at 32,768 tokens, 16 GiB at 131,072). A setting that
did not fit at fewer tokens on the same GPUs is not planned again (more tokens never take less
memory). Each (model, GPUs) group runs in its own process; rows are appended to
benchmarks/results/memplan/table.jsonl as they finish (``--resume`` skips planned groups).
No GPU has checked these predictions.

    python -m benchmarks.micro.memory_plan_table [--models qwen3-0.6b ...] [--resume]
    python -m benchmarks.micro.memory_plan_table --markdown
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks.harness.paths import results_dir
from benchmarks.micro.memory_plan import in_subprocess

GIB = 1 << 30
MODELS = ("qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-30b-a3b")
TOKENS = (8192, 32768, 65536, 131072)
WORLDS = (1, 2, 4, 8)
USABLE = int(80 * GIB * 0.9)  # H100 80GB less the planner's 10% margin


def ladder(heads: int, world: int) -> list[dict]:
    """The settings tried for one cell, in order."""
    cps = [c for c in (2, 4, 8) if c <= world and world % c == 0 and heads % c == 0]
    out = [dict(cp=1, offload=False)] + [dict(cp=c, offload=False) for c in cps]
    return out + [dict(cp=(cps or [1])[-1], offload=True)]


def plan_one(model: str, tokens: int, world: int, cp: int, offload: bool) -> dict:
    from arealite.api.config.actor import MixedPrecisionConfig, PPOActorConfig
    from arealite.memplan.model_shapes import shape_config
    from arealite.memplan.trainer_memory import predict_trainer

    cfg = PPOActorConfig(path="unused", dtype="float32", max_tokens_per_mb=tokens,
                         mixed_precision=MixedPrecisionConfig(param_dtype="bfloat16",
                                                              reduce_dtype="float32"),
                         gradient_checkpointing=True, logprob_head="fused",
                         # context parallelism wraps the segment kernel (the engine's rule)
                         attn_impl="flash_attention_2" if cp == 1 else "segments",
                         shared_prompt_packing=False,
                         context_parallel_size=cp, cpu_offload=offload)
    r = predict_trainer(cfg, shape_config(model), world)
    return {"peak": r.peak, "breakdown": r.breakdown, "seconds": r.seconds,
            "fits_h100_80gb": r.peak <= USABLE}


def group(point: dict) -> dict:
    """Every cell of one model on one GPU count, appended to ``point["out"]`` row by row."""
    from arealite.memplan.model_shapes import shape_config

    model, world, out = point["model"], point["world"], Path(point["out"])
    heads = shape_config(model)["num_attention_heads"]
    hopeless: set[tuple[int, bool]] = set()  # settings over at fewer tokens
    for tokens in TOKENS:
        for s in ladder(heads, world):
            key = (s["cp"], s["offload"])
            row = dict(model=model, tokens=tokens, world=world, **s)
            if key in hopeless:
                row.update(planned=False, fits_h100_80gb=False)
            else:
                row.update(planned=True, **plan_one(model, tokens, world, **s))
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            if row["fits_h100_80gb"]:
                break
            hopeless.add(key)
    return {"done": True}


def _knobs(r: dict) -> str:
    parts = ([f"cp {r['cp']}"] if r["cp"] > 1 else []) + (["offload"] if r["offload"] else [])
    return " + ".join(parts)


def _cell(trials: list[dict]) -> str:
    fit = [r for r in trials if r["fits_h100_80gb"]]
    planned = [r for r in trials if r.get("planned", True)]
    if fit:
        k = _knobs(fit[0])
        return f"**{fit[0]['peak'] / GIB:.1f}**" + (f" ({k})" if k else "")
    if planned:
        best = min(planned, key=lambda r: r["peak"])
        k = _knobs(best)
        return f"over: {best['peak'] / GIB:.1f}" + (f" ({k})" if k else "")
    return "over"  # every setting was over at fewer tokens


def _inferred(by_cell: dict, model: str, tokens: int, world: int) -> str:
    """A cell not planned, from its neighbours: a setting that fits on fewer GPUs fits on more
    (FSDP2 shards more of the same, so the per-rank peak is at most that plan's: a bound); a
    cell over with every setting on more GPUs is over on fewer."""
    fewer = [w for w in WORLDS if w < world and by_cell.get((model, tokens, w))]
    for w in sorted(fewer, reverse=True):
        fit = [r for r in by_cell[(model, tokens, w)] if r["fits_h100_80gb"]]
        if fit:
            k = _knobs(fit[0])
            return f"<= {fit[0]['peak'] / GIB:.1f}" + (f" ({k})" if k else "")
    more = [w for w in WORLDS if w > world and by_cell.get((model, tokens, w))]
    if any(not any(r["fits_h100_80gb"] for r in by_cell[(model, tokens, w)]) for w in more):
        return "over"
    return "-"


def markdown(rows: list[dict]) -> str:
    """A row per model and token count, a column per GPU count; each cell the first setting
    that fits (its per-rank peak in GiB, bold, and the knobs it adds to the recipe), or "over"
    with the lowest planned peak and its setting; a cell not planned is inferred from its
    neighbours ("<=": a bound) or "-"."""
    by_cell: dict[tuple, list[dict]] = {}
    for r in rows:
        by_cell.setdefault((r["model"], r["tokens"], r["world"]), []).append(r)
    lines = ["| model | tokens/micro-batch | " + " | ".join(f"{w} x H100" for w in WORLDS) + " |",
             "|---|---:|" + "---|" * len(WORLDS)]
    for model in MODELS:
        for tokens in TOKENS:
            cells = [_cell(by_cell[(model, tokens, w)]) if (model, tokens, w) in by_cell
                     else _inferred(by_cell, model, tokens, w) for w in WORLDS]
            if any(c != "-" for c in cells):
                lines.append(f"| {model} | {tokens:,} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--worlds", nargs="*", type=int, default=[1, 8, 2, 4],
                    help="GPU counts, in the order planned")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--out", default="table.jsonl", help="rows file under "
                    "benchmarks/results/memplan/ (--markdown reads every table*.jsonl there)")
    ap.add_argument("--markdown", action="store_true", help="print the table of the planned "
                    "cells and exit")
    a = ap.parse_args(argv)
    out = results_dir("memplan")
    path = out / a.out
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    if a.markdown:
        every = [json.loads(x) for f in sorted(out.glob("table*.jsonl"))
                 for x in f.read_text().splitlines()]
        sys.stdout.write(markdown(every))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    if a.resume:  # a group is done when its largest token count fits or its ladder ended
        done = {(r["model"], r["world"]) for r in rows if r["tokens"] == TOKENS[-1]
                and (r["fits_h100_80gb"] or r["offload"])}
        keep = [r for r in rows if (r["model"], r["world"]) in done]
        path.write_text("".join(json.dumps(r) + "\n" for r in keep))
    else:
        done = set()
        path.unlink(missing_ok=True)
    for world in a.worlds:  # every model at the first GPU count first (a run cut short has
        for model in a.models:  # whole columns)
            if (model, world) in done:
                continue
            t0 = time.time()
            in_subprocess("group", dict(model=model, world=world, out=str(path)),
                          "benchmarks.micro.memory_plan_table")
            got = [json.loads(x) for x in path.read_text().splitlines()]
            n = sum(r["planned"] for r in got if (r["model"], r["world"]) == (model, world))
            print(f"{model:<14} x{world}: {n} plans in {time.time() - t0:.0f} s", flush=True)
    sys.stdout.write(markdown([json.loads(x) for x in path.read_text().splitlines()]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
