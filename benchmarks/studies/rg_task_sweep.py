"""Which reasoning-gym task leaves a real model room to learn: the base model's held-out figures
on each candidate task.

Held-out rows come from ``arealite.dataset.reasoning_gym`` (the job's own split, prompts and
system prompt). Two ways to measure:

- default: greedy completions batched with transformers' ``generate`` (left padding), scored by
  ``workflows.rewards.reasoning_gym`` in-process: the mean score (the task's own partial
  credit) with the tag required and with an untagged reply taken whole, and the share scored 1.0;
- ``--arealite``: the trainer's own held-out evaluation (``arealite.observe.heldout_eval``) through
  an embedded server and the real-model job's workflow and reward
  (``configs/smollm2_rg_grpo.yaml``): ``right`` (the answer right wherever it stands), ``exact``
  (right and in the format the reward pays), ``format``, the mean score, the majority-answer
  share beside the gold's, and with ``--pass-k K`` the pass@K of right over K replies a row
  sampled at the job's temperature (the headroom RL can draw on). ``--shots N`` puts N solved
  problems of the task before each question, as earlier turns whose answers are in the
  required format (``<answer>N</answer>``), each row its own N (``build_rows``' few-shot prompt,
  the real-model job's), so format is shown rather than learned.

Prints one line per task and writes ``benchmarks/results/rg_task_sweep/<label>.json``.

    python -m benchmarks.studies.rg_task_sweep --model outputs/assets/smollm2 \
        --tasks chain_sum,basic_arithmetic,leg_counting --n 32 --max-new-tokens 16
    python -m benchmarks.studies.rg_task_sweep --arealite --shots 3 --pass-k 8 --n 64 \
        --max-new-tokens 12 --tasks chain_sum,gcd --label smollm2_fewshot
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
            rec[f"score_{mode}"] = sum(scores) / len(scores)
            rec[f"exact_{mode}"] = sum(x >= 1.0 for x in scores) / len(scores)
        rec["seconds"] = time.monotonic() - t0
        rec["samples"] = [{"gold": r["answer"], "out": c} for r, c in zip(rows, comps)]
        table.append(rec)
        print(
            f"{name:24s} mean score {rec['score_whole']:.3f}  exact {rec['exact_whole']:.3f}  "
            f"(tag required: {rec['score_none']:.3f})  {rec['seconds']:.0f}s",
            flush=True,
        )
        out.write_text(json.dumps({"args": vars(a), "table": table}, indent=1))
    return table


def few_shot_rows(spec, n: int, shots: int, seed: int, system_prompt: str,
                  prefix: str) -> list[dict]:
    """``n`` held-out rows of one task, each prompt with ``shots`` solved problems of the same
    task before its question, drawn per row (``build_rows``' few-shot prompt, as the job's)."""
    from arealite.dataset.reasoning_gym import build_rows

    return build_rows([spec], n, seed, "valid", system_prompt, answer_prefix=prefix, shots=shots)


def sweep_arealite(a: argparse.Namespace, tasks: list[str], out: Path) -> list[dict]:
    """One record per task from the trainer's own evaluation on one embedded server: greedy
    right / exact / format / score / majority shares, and pass@k of sampled replies."""
    import tempfile

    from arealite.api.config.experiment import GRPOConfig
    from arealite.api.config.loader import load_config
    from arealite.api.config.run import EvaluatorConfig
    from arealite.api.workflow_factory import build_workflow
    from arealite.dataset.reasoning_gym import TaskSpec
    from arealite.observe.heldout_eval import COMPLETIONS_FILE, evaluate
    from arealite.rollout.remote_engine import RemoteInferenceEngine
    from arealite.trainer.common import load_tokenizer
    from arealite.trainer.rl_engines import eval_generation, eval_rollout_config
    from benchmarks.harness.paths import ROOT
    from benchmarks.harness.server_process import Server

    configs = json.loads(a.configs)
    config = load_config(str(ROOT / "configs" / "smollm2_rg_grpo.yaml"),
                         [f"actor.path={a.model}", f"gconfig.max_new_tokens={a.max_new_tokens}"],
                         GRPOConfig)
    tok = load_tokenizer(a.model)
    greedy = build_workflow(config.workflow, eval_generation(config), tok)
    k = a.pass_k
    sampled = build_workflow(config.workflow, config.gconfig.new(n_samples=k), tok) if k else None
    ev = EvaluatorConfig(pass_k=k or None, rows_shown=0)
    table: list[dict] = []
    with Server(a.model, "--dtype", "float32", "--random-seed", str(a.seed),
                "--context-length", "1024") as server:
        for name in tasks:
            t0 = time.monotonic()
            spec = TaskSpec(name, 1.0, configs.get(name, {}))
            try:
                rows = few_shot_rows(spec, a.n, a.shots, a.seed, a.system_prompt, a.answer_prefix)
            except ValueError as e:
                print(f"{name:24s} skipped: {e}", flush=True)
                table.append({"task": name, "error": str(e)})
                continue
            cfg = eval_rollout_config(config, len(rows) * max(k, 1))
            engine = RemoteInferenceEngine(cfg.model_copy(update={"server_addrs": [server.addr]}))
            engine.initialize()
            try:
                with tempfile.TemporaryDirectory() as tmp:
                    figs = evaluate(engine, greedy, rows, ev, tok, sampled, tmp, 0)
                    kept = [json.loads(x) for x in (Path(tmp) / COMPLETIONS_FILE).read_text().splitlines()]
            finally:
                engine.destroy()
            rec = {"task": name, "config": spec.config, "shots": a.shots, "n": len(rows),
                   **{key.removeprefix("eval/"): v for key, v in figs.items()},
                   "seconds": time.monotonic() - t0,
                   "samples": [{"gold": r["gold"], "reply": r["reply"], "right": r["right"],
                                "exact": r["exact"]} for r in kept[:12]]}
            table.append(rec)
            pk = f"  pass@{k} {rec[f'pass@{k}']:.3f}" if k else ""
            print(f"{name:24s} right {rec['right']:.3f}  exact {rec['exact']:.3f}  format "
                  f"{rec['format']:.3f}  score {rec['score']:.3f}{pk}  majority "
                  f"{rec['majority_share']:.2f} (gold {rec['gold_majority_share']:.2f})  "
                  f"{rec['seconds']:.0f}s", flush=True)
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
    p.add_argument("--arealite", action="store_true",
                   help="the trainer's own evaluation on an embedded server (right, exact, format, pass@k)")
    p.add_argument("--shots", type=int, default=0, help="(--arealite) solved examples before each question")
    p.add_argument("--pass-k", type=int, default=0, help="(--arealite) pass@k from k sampled replies a row; 0: off")
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
    (sweep_arealite if a.arealite else sweep)(a, tasks, out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
