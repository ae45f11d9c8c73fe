"""Which reasoning-gym task leaves a real model room to learn: the base model's held-out greedy
accuracy (mean of the task's own ``score_answer``) on each candidate task.

Held-out rows come from ``arealite.dataset.reasoning_gym`` (the job's own split, prompts and
system prompt); completions are greedy, batched with transformers' ``generate`` (left padding),
and scored by ``workflows.rewards.reasoning_gym`` in-process. Prints one line per task and
writes ``benchmarks/results/rg_task_sweep/<label>.json``.

    python -m benchmarks.studies.rg_task_sweep --model outputs/assets/smollm2 \
        --tasks chain_sum,basic_arithmetic,leg_counting --n 32 --max-new-tokens 16
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from benchmarks.harness.paths import results_dir


def _render(tok, messages):
    from workflows.prompting import render_chat

    return render_chat(tok, messages)


def greedy_completions(model, tok, rows: list[dict], max_new_tokens: int, batch: int) -> list[str]:
    import torch

    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    texts = [_render(tok, r["messages"]) for r in rows]  # as the workflow renders them
    out = []
    for i in range(0, len(texts), batch):
        enc = tok(texts[i : i + batch], return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            gen = model.generate(
                **enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id
            )
        out += tok.batch_decode(gen[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    return out


def sweep(a: argparse.Namespace, tasks: list[str], out: Path) -> list[dict]:
    """One record per task, from one greedy pass: the mean of the task's own score with the
    answer tag required (``untagged="none"``) and with an untagged reply taken whole
    (``"whole"``, the job's setting), and the share scored 1.0. ``out`` is rewritten after
    every task, so a long sweep stopped early keeps what it measured."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from arealite.dataset.reasoning_gym import TaskSpec, build_rows
    from workflows.rewards.reasoning_gym import reasoning_gym_reward

    torch.manual_seed(a.seed)
    configs = json.loads(a.configs)
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval()
    table: list[dict] = []
    for name in tasks:
        t0 = time.monotonic()
        spec = TaskSpec(name, 1.0, configs.get(name, {}))
        try:
            rows = build_rows(
                [spec], a.n, a.seed, "valid", a.system_prompt, answer_prefix=a.answer_prefix
            )
        except ValueError as e:
            print(f"{name:24s} skipped: {e}", flush=True)
            table.append({"task": name, "error": str(e)})
            continue
        comps = greedy_completions(model, tok, rows, a.max_new_tokens, a.batch)
        rec = {"task": name, "config": spec.config, "n": len(rows)}
        for mode in ("none", "whole"):
            scores = [reasoning_gym_reward("", c, untagged=mode, **r) for r, c in zip(rows, comps)]
            rec[f"accuracy_{mode}"] = sum(scores) / len(scores)
            rec[f"exact_{mode}"] = sum(x >= 1.0 for x in scores) / len(scores)
        rec["seconds"] = time.monotonic() - t0
        rec["samples"] = [{"gold": r["answer"], "out": c} for r, c in zip(rows, comps)]
        table.append(rec)
        print(
            f"{name:24s} mean score {rec['accuracy_whole']:.3f}  exact {rec['exact_whole']:.3f}  "
            f"(tag required: {rec['accuracy_none']:.3f})  {rec['seconds']:.0f}s",
            flush=True,
        )
        out.write_text(json.dumps({"args": vars(a), "table": table}, indent=1))
    return table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="outputs/assets/smollm2")
    p.add_argument("--tasks", required=True, help="comma-separated reasoning-gym task names")
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--system-prompt", default="direct")
    p.add_argument("--answer-prefix", default="<answer>")
    p.add_argument(
        "--configs",
        default="{}",
        help='task configs (difficulty), JSON: {"chain_sum": {"max_terms": 2}}',
    )
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--label", default="smollm2")
    a = p.parse_args(argv)
    tasks = [t.strip() for t in a.tasks.split(",") if t.strip()]
    try:
        from arealite.dataset.reasoning_gym import check_task_names

        check_task_names(tasks)
        json.loads(a.configs)
    except ValueError as e:
        print(f"rg_task_sweep: {e}", file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(a.threads)
    out = results_dir("rg_task_sweep") / f"{a.label}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    sweep(a, tasks, out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
