"""What a trained model gets right that the base model did not, by reasoning-gym task.

Both models answer the job's own held-out rows (``valid.jsonl`` of a real-model job's data
folder) greedily, with the same prompts, batching and verifier as ``rg_task_sweep``; each
problem is then one of: right in both, gained (wrong → right), lost (right → wrong), wrong in
both ("right" = the task's own score is 1.0). A gained problem whose base reply already held the
gold answer as a number or word of its own (``5 + 1 = 6`` for ``6``) is counted as a format gain:
the model learned to give the answer alone, not to find it. Prints per task the mean score of
each model, the four counts and the format gains, and a few gained and lost problems with both
answers; writes
``benchmarks/results/real_model/gains_<label>.json``.

    python -m benchmarks.studies.rg_gains --data outputs/assets/rg/<hash> \
        --base outputs/assets/smollm2 --trained outputs/smollm2-rg-grpo/learn3/checkpoints/step60 \
        --label seed3_step60
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

from benchmarks.harness.paths import results_dir
from benchmarks.studies.rg_task_sweep import greedy_completions


def _outcome(before: float, after: float) -> str:
    right_before, right_after = before >= 1.0, after >= 1.0
    if right_before and right_after:
        return "right_both"
    if right_after:
        return "gained"
    if right_before:
        return "lost"
    return "wrong_both"


def holds_answer(reply: str, gold: str) -> bool:
    """The gold answer appears in the reply as a token of its own (not inside a longer number)."""
    return re.search(r"(?<![\w.-])" + re.escape(gold.strip()) + r"(?!\w|\.\d)", reply) is not None


def compare(rows: list[dict], base: list[str], trained: list[str]) -> dict:
    """Per task: both models' mean scores, the four outcome counts, and every gained/lost
    problem with both answers (the printout shows a few)."""
    from workflows.rewards.reasoning_gym import reasoning_gym_reward

    by_task: dict[str, dict] = defaultdict(
        lambda: {
            "n": 0,
            "score_base": 0.0,
            "score_trained": 0.0,
            "right_both": 0,
            "gained": 0,
            "format_gains": 0,
            "lost": 0,
            "wrong_both": 0,
            "examples": [],
        }
    )
    for row, b, t in zip(rows, base, trained, strict=True):
        sb = reasoning_gym_reward("", b, untagged="whole", **row)
        st = reasoning_gym_reward("", t, untagged="whole", **row)
        rec = by_task[row["task"]]
        rec["n"] += 1
        rec["score_base"] += sb
        rec["score_trained"] += st
        kind = _outcome(sb, st)
        rec[kind] += 1
        if kind == "gained" and holds_answer(b, row["answer"]):
            rec["format_gains"] += 1
        if kind in ("gained", "lost"):
            rec["examples"].append(
                {
                    "outcome": kind,
                    "question": row["question"],
                    "gold": row["answer"],
                    "base": b,
                    "trained": t,
                }
            )
    for rec in by_task.values():
        rec["score_base"] /= rec["n"]
        rec["score_trained"] /= rec["n"]
    return dict(by_task)


def _load(path: str, threads: int):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(path)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), tok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="a real-model job's data folder (valid.jsonl)")
    p.add_argument("--base", default="outputs/assets/smollm2")
    p.add_argument("--trained", required=True, help="a checkpoint folder (HF format)")
    p.add_argument("--max-new-tokens", type=int, default=12, help="the job's own setting")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--show", type=int, default=3, help="gained and lost examples shown per task")
    p.add_argument("--label", required=True)
    a = p.parse_args(argv)
    valid = Path(a.data) / "valid.jsonl"
    for path, what in (
        (valid, "held-out rows"),
        (Path(a.base) / "config.json", "base model"),
        (Path(a.trained) / "config.json", "trained model"),
    ):
        if not path.is_file():
            print(f"rg_gains: no {what} at {path}", file=sys.stderr)
            return 2
    rows = [json.loads(line) for line in valid.read_text().splitlines() if line.strip()]
    answers = {}
    for name, path in (("base", a.base), ("trained", a.trained)):
        model, tok = _load(path, a.threads)
        answers[name] = greedy_completions(model, tok, rows, a.max_new_tokens, a.batch)
        del model
    table = compare(rows, answers["base"], answers["trained"])
    for task, rec in sorted(table.items()):
        print(
            f"{task:16s} n={rec['n']:3d}  mean score {rec['score_base']:.3f} -> "
            f"{rec['score_trained']:.3f}  right in both {rec['right_both']:3d}  gained "
            f"{rec['gained']:3d} (format {rec['format_gains']})  lost {rec['lost']:3d}  wrong in both {rec['wrong_both']:3d}"
        )
        for kind in ("gained", "lost"):
            for ex in [e for e in rec["examples"] if e["outcome"] == kind][: a.show]:
                print(
                    f"    {kind:6s} {ex['question'][-60:]!r} gold {ex['gold']!r}: "
                    f"base {ex['base']!r} -> trained {ex['trained']!r}"
                )
    out = results_dir("real_model") / f"gains_{a.label}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(a), "by_task": table}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
