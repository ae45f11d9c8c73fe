"""Held-out greedy accuracy of vision-language checkpoints on the toy counting task, split by
the true answer and by the asked colour: which part of the task a phase (SFT, GRPO) improved.

    python -m benchmarks.studies.vision_by_answer VALID_JSONL MODEL_DIR [MODEL_DIR ...] [--limit N]

Each model directory is a whole HF directory with its processor (an SFT output, a GRPO
checkpoint). Decoding is transformers' greedy ``generate`` (up to 4 new tokens, the vision
job's evaluation budget) on the prompt ``VisionRLVRWorkflow`` builds, scored by the job's own
reward (``counting_reward``); the total is the server's greedy ``eval/score`` (mean reward) of the same
weights. Prints one line a model: the total, then ``right/rows`` per answer and per colour.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from arealite.api.vision_io import encode_vision_prompt
from arealite.engine.vision_processor import load_processor
from workflows.rewards.counting import counting_reward

MAX_NEW_TOKENS = 4


def greedy_completions(model_dir: str | Path, rows: list[dict[str, Any]]) -> list[str]:
    """Each row's greedy completion (``MAX_NEW_TOKENS`` at most), special tokens dropped."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    proc = load_processor(model_dir)
    texts = []
    with torch.no_grad():
        for row in rows:
            ids, _, enc = encode_vision_prompt(proc, row["question"], row["images"])
            inputs = {k: v for k, v in enc.items() if isinstance(v, torch.Tensor)}
            out = model.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
            texts.append(proc.tokenizer.decode(out[0, len(ids):], skip_special_tokens=True))
    return texts


def tally(rows: list[dict[str, Any]], completions: list[str]) -> dict[str, Any]:
    """``{"accuracy", "by_answer": {answer: [right, n]}, "by_colour": {colour: [right, n]}}``,
    each completion scored by the job's reward."""
    by_answer: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    by_colour: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    right = 0
    for row, text in zip(rows, completions, strict=True):
        ok = int(counting_reward("", text, answer=row["answer"]) == 1.0)
        right += ok
        for table, key in ((by_answer, row["answer"]), (by_colour, row["colour"])):
            table[key][0] += ok
            table[key][1] += 1
    return {"accuracy": right / max(len(rows), 1), "by_answer": dict(sorted(by_answer.items())),
            "by_colour": dict(sorted(by_colour.items()))}


def format_line(name: str, res: dict[str, Any]) -> str:
    def cells(table: dict[str, list[int]]) -> str:
        return " ".join(f"{k}:{r}/{n}" for k, (r, n) in table.items())

    return (f"{name}: accuracy {res['accuracy']:.3f} | by answer {cells(res['by_answer'])} | "
            f"by colour {cells(res['by_colour'])}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("valid", type=Path, help="held-out rows (toy_vision valid.jsonl)")
    ap.add_argument("models", nargs="+", type=Path, help="model directories to evaluate")
    ap.add_argument("--limit", type=int, default=None, help="first N rows only")
    args = ap.parse_args(argv)
    if not args.valid.is_file():
        print(f"vision_by_answer: no such file: {args.valid}", file=sys.stderr)
        return 2
    rows = [json.loads(x) for x in args.valid.read_text().splitlines() if x.strip()][: args.limit]
    for d in args.models:
        if not (d / "preprocessor_config.json").is_file():
            print(f"vision_by_answer: {d} is not a vision model directory with its processor",
                  file=sys.stderr)
            return 2
    for d in args.models:
        print(format_line(str(d), tally(rows, greedy_completions(d, rows))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
