"""TRL's ``GRPOTrainer`` on the toy arithmetic task: the TRL side of ``benchmarks/studies/vs_trl.py``.

Runs in the TRL virtualenv (``make setup-trl``), never in arealite's: it imports TRL,
transformers and torch, plus only the repo's pure-Python toy grader
(``workflows.rewards.toy.toy_reward``, whose imports are the standard library and
``arealite.api.reward_api``), so both systems score completions with the same function.

    .venv-trl/bin/python benchmarks/studies/trl_grpo.py --model DIR --data DIR --out RESULT.json [...]

What it does: GRPO from the given (SFT) checkpoint on ``DATA/train.jsonl`` with
``use_vllm=False`` on the CPU in fp32, generation in line with training (TRL's own path),
without gradient checkpointing (TRL's default is on; nothing to save on a ~1M-parameter
model). Every ``--eval-every`` optimizer steps (and before the first) a callback grades greedy replies to
``DATA/valid.jsonl`` with the same grader and the same ``--max-new-tokens`` as arealite's default
evaluation does (``arealite.observe.heldout_grading``, pure Python): ``right`` (the answer right
wherever it stands), ``exact`` (paid in full) and the mean score; its seconds are kept off the
training clock. Training stops once the training clock passes ``--seconds`` (after
an evaluation). The result JSON holds the evaluation curve ``[[step, train_seconds, right, exact, score]]``,
the steps, the training seconds and the time spent in generation + scoring (TRL's
``_generate_and_score_completions``) versus the rest of the step (forward, backward, AdamW).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the toy grader only (pure Python)

from arealite.observe import heldout_grading as hg  # noqa: E402
from workflows.rewards.toy import toy_reward  # noqa: E402

TASKS = ("toy", "rg")  # the toy arithmetic task; reasoning-gym rows (arealite rg-data)


def read_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def as_prompt(row: dict[str, Any]) -> list[dict[str, str]]:
    """The row's conversation as arealite's RLVR workflow renders it through the tokenizer's
    chat template (``workflows.prompting.encode_prompt``): its ``messages`` (reasoning-gym rows:
    system prompt, question, a prefilled assistant turn, which TRL continues as arealite does),
    else the question as one user message."""
    if row.get("messages"):
        return list(row["messages"])
    return [{"role": "user", "content": str(row["question"])}]


REAL_CONFIG = ROOT / "configs" / "smollm2_rg_grpo.yaml"


@functools.lru_cache(maxsize=1)
def rg_reward_kwargs() -> dict[str, Any]:
    """The real-model job's reward settings (its config's ``workflow.kwargs.reward_kwargs``),
    so TRL is paid exactly as arealite is; read once (every reward call asks)."""
    import yaml

    return dict(yaml.safe_load(REAL_CONFIG.read_text())["workflow"]["kwargs"]["reward_kwargs"])


def score(task: str, text: str, row: dict[str, Any]) -> float:
    """The task's grader on one completion: the toy grader, or reasoning-gym's own verifier
    through ``workflows.rewards.reasoning_gym`` with the real-model job's settings."""
    if task == "toy":
        return toy_reward("", text, answer=row["answer"])
    from workflows.rewards.reasoning_gym import reasoning_gym_reward

    fields = {k: row[k] for k in ("task", "question", "answer", "messages") if k in row}
    return reasoning_gym_reward("", text, metadata=json.loads(row["metadata_json"]),
                                task_config=json.loads(row["task_config_json"]),
                                **rg_reward_kwargs(), **fields)


def grade(task: str, text: str, row: dict[str, Any]) -> tuple[float, float, float]:
    """(right, exact, score) of one held-out reply, as arealite's default evaluation grades it."""
    def pays(completion: str) -> float | None:
        return score(task, completion, row)

    gold, paid = str(row["answer"]), score(task, text, row)
    g = hg.grade(text, gold, paid, pays, 1.0, hg.gold_template(gold, pays, 1.0))
    return float(g.right), float(g.exact), g.score


def trl_prompt(row: dict[str, Any], tokenizer: Any) -> list[dict[str, str]] | str:
    """The prompt as TRL is given it. TRL renders a conversational prompt with
    ``add_generation_prompt=True`` always, which closes a prefilled assistant turn and opens a
    new one (the model then answers after ``<answer><|im_end|>``); a prefilled conversation goes
    as the text the chat template renders with ``continue_final_message``, which TRL tokenizes to
    the same ids arealite generates from (``test_trl_grpo`` checks it), so TRL continues it."""
    messages = as_prompt(row)
    if messages[-1]["role"] != "assistant":
        return messages
    return tokenizer.apply_chat_template(messages, continue_final_message=True, tokenize=False)


def as_column_row(task: str, row: dict[str, Any], tokenizer: Any = None) -> dict[str, Any]:
    """A training row for ``datasets``: the prompt, and what the grader reads, with the nested
    per-task dicts and the conversation as JSON text (their keys differ from task to task, which
    Arrow cannot mix)."""
    prompt = as_prompt(row) if tokenizer is None else trl_prompt(row, tokenizer)
    out = {"prompt": prompt, "answer": row["answer"]}
    if task == "rg":
        out.update(task=row["task"], question=row["question"], metadata_json=json.dumps(row["metadata"]),
                   task_config_json=json.dumps(row.get("task_config") or {}),
                   messages_json=json.dumps(as_prompt(row)))
    return out


def completion_text(completion: Any) -> str:
    """TRL passes a conversational completion as ``[{"role": "assistant", "content": ...}]``."""
    if isinstance(completion, list):
        return "".join(str(m.get("content", "")) for m in completion)
    return str(completion)


def toy_reward_trl(prompts: list, completions: list, answer: list[str], **_: Any) -> list[float]:
    """TRL's reward-function signature over the repo's toy grader."""
    return [toy_reward("", completion_text(c), answer=a) for c, a in zip(completions, answer)]


def reward_fn(task: str):
    """TRL's reward-function signature over the task's grader (columns arrive as lists)."""

    def reward(prompts: list, completions: list, **columns: Any) -> list[float]:
        rows = [{k: v[i] for k, v in columns.items() if isinstance(v, list) and len(v) == len(completions)}
                for i in range(len(completions))]
        for r, p in zip(rows, prompts):  # the conversation, its prefill included, as arealite's reward sees it
            r["messages"] = json.loads(r.pop("messages_json")) if "messages_json" in r else p
        return [score(task, completion_text(c), r) for c, r in zip(completions, rows)]

    reward.__name__ = f"{task}_reward"
    return reward


def greedy_eval(model: Any, tokenizer: Any, rows: list[dict[str, Any]], max_new_tokens: int,
                batch: int = 256, task: str = "toy") -> tuple[float, float, float]:
    """Greedy completions over ``rows`` (left-padded batched ``generate``): the shares right and
    exact and the mean score (``grade``)."""
    import torch

    was_training = model.training
    model.eval()
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    sums = [0.0, 0.0, 0.0]
    try:
        for i in range(0, len(rows), batch):
            chunk = rows[i: i + batch]
            prefill = as_prompt(chunk[0])[-1]["role"] == "assistant"  # continued, not a new turn
            enc = tokenizer.apply_chat_template([as_prompt(r) for r in chunk], add_generation_prompt=not prefill,
                                                continue_final_message=prefill, tokenize=True, padding=True,
                                                return_dict=True, return_tensors="pt")
            with torch.no_grad():
                out = model.generate(**enc, do_sample=False, max_new_tokens=max_new_tokens,
                                     eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
            texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
            for t, r in zip(texts, chunk):
                sums = [x + y for x, y in zip(sums, grade(task, t, rg_fields(task, r)))]
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    right, exact, mean_score = (x / max(len(rows), 1) for x in sums)
    return right, exact, mean_score


def rg_fields(task: str, row: dict[str, Any]) -> dict[str, Any]:
    """A held-out row as the grader reads it (the training rows' column form)."""
    return {**as_column_row(task, row), "messages": as_prompt(row)} if task == "rg" else row


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="the SFT checkpoint (HF folder with tokenizer)")
    p.add_argument("--data", required=True, help="folder with train.jsonl and valid.jsonl")
    p.add_argument("--out", required=True, help="where the result JSON goes")
    p.add_argument("--seconds", type=float, required=True, help="training seconds (evaluations excluded)")
    p.add_argument("--prompts", type=int, default=8, help="prompts per optimizer step")
    p.add_argument("--samples", type=int, default=8, help="completions per prompt")
    p.add_argument("--max-new-tokens", type=int, default=5)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--min-lr-ratio", type=float, default=0.2, help="cosine schedule's floor")
    p.add_argument("--max-steps", type=int, default=375, help="length of the lr schedule")
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--eval-prompts", type=int, default=0, help="0: the whole held-out set")
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--task", default="toy", choices=TASKS, help="toy arithmetic or reasoning-gym rows")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    import tempfile

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(a.threads)
    data = Path(a.data)
    tokenizer = AutoTokenizer.from_pretrained(a.model)
    train = Dataset.from_list([as_column_row(a.task, r, tokenizer) for r in read_rows(data / "train.jsonl")])
    valid = read_rows(data / "valid.jsonl")
    valid = valid[: a.eval_prompts] if a.eval_prompts else valid
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)

    phase = {"generate_s": 0.0}

    class TimedGRPOTrainer(GRPOTrainer):
        """Times TRL's generation + scoring phase (the rest of the step is the update)."""

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            t = time.perf_counter()
            try:
                return super()._generate_and_score_completions(inputs)
            finally:
                phase["generate_s"] += time.perf_counter() - t

    class EvalClock(TrainerCallback):
        """Greedy held-out right / exact / mean score every N steps, off the training clock;
        stops on the budget."""

        def __init__(self) -> None:
            self.curve: list[list[float]] = []
            self.eval_s = 0.0
            self.t0 = 0.0

        def train_seconds(self) -> float:
            return time.perf_counter() - self.t0 - self.eval_s

        def evaluate(self, step: int, model: Any) -> None:
            te = time.perf_counter()
            trained = self.train_seconds() if self.t0 else 0.0
            right, exact, mean_score = greedy_eval(model, tokenizer, valid, a.max_new_tokens, task=a.task)
            self.curve.append([step, trained, right, exact, mean_score])
            print(f"trl step {step}: train {trained:.1f}s, held-out right {right:.3f} exact "
                  f"{exact:.3f} mean score {mean_score:.3f}", flush=True)
            self.eval_s += time.perf_counter() - te

        def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
            self.evaluate(0, model)
            self.t0 = time.perf_counter()
            self.eval_s = 0.0

        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> Any:
            over = self.train_seconds() >= a.seconds
            if over or state.global_step % a.eval_every == 0 or state.global_step >= state.max_steps:
                self.evaluate(state.global_step, model)
            if over:
                control.should_training_stop = True
            return control

    clock = EvalClock()
    with tempfile.TemporaryDirectory(prefix="trl-grpo-") as out_dir:
        args = GRPOConfig(
            output_dir=out_dir, use_cpu=True, bf16=False, fp16=False, seed=a.seed,
            per_device_train_batch_size=a.prompts * a.samples, gradient_accumulation_steps=1,
            num_generations=a.samples, max_completion_length=a.max_new_tokens, temperature=1.0,
            learning_rate=a.lr, lr_scheduler_type="cosine_with_min_lr",
            lr_scheduler_kwargs={"min_lr_rate": a.min_lr_ratio}, warmup_steps=0, weight_decay=0.0,
            max_grad_norm=1.0, max_steps=a.max_steps, beta=0.0, epsilon=0.2, use_vllm=False,
            logging_steps=a.eval_every, report_to="none", save_strategy="no", disable_tqdm=True,
            dataloader_num_workers=0,
            # TRL defaults to recomputing activations in the backward (memory for compute); a
            # ~1M-parameter model needs no memory saved, so TRL gets its faster setting
            gradient_checkpointing=False,
        )
        trainer = TimedGRPOTrainer(model=model, reward_funcs=reward_fn(a.task), args=args, train_dataset=train,
                                   processing_class=tokenizer, callbacks=[clock])
        trainer.train()
    steps = int(trainer.state.global_step)
    last = clock.curve[-1]
    train_s = float(last[1])
    result = {"steps": steps, "train_s": train_s, "curve": clock.curve, "eval_s": clock.eval_s,
              "phases": {"generate": phase["generate_s"] / max(steps, 1),
                         "train": max(train_s - phase["generate_s"], 0.0) / max(steps, 1)},
              "versions": {"torch": torch.__version__, "trl": __import__("trl").__version__,
                           "transformers": __import__("transformers").__version__},
              "threads": a.threads}
    Path(a.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
