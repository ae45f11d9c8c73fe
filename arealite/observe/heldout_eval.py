"""The default held-out evaluation (no ``evaluator.eval_fn``): skill told apart from format, and
collapse caught, from the run's reward function and the dataset's answer field alone.

Per task (a row's ``task`` field) and overall, on the held-out rows (greedy by default):

- ``eval/right``: share of replies whose answer is right wherever it stands (the reward
  function, the task's own checker, asked about the reply's answer alone put in a form it pays
  for the gold; ``heldout_grading.grade``);
- ``eval/exact``: share the reward pays in full (right *and* in the required format);
- ``eval/format``: share in the required format, whatever the answer;
- ``eval/score``: the mean reward of the replies (a task's partial credit where it gives one,
  as reasoning-gym's do), never called accuracy;
- ``eval/pass@k``: with ``evaluator.pass_k``, ``pass_n`` sampled replies a row at the training
  temperature, the unbiased pass@k of ``right`` (``eval/pass@k_exact``: of ``exact``);
- ``eval/majority_share`` beside ``eval/gold_majority_share``, and ``eval/collapse`` (1.0, with a
  warning line) when the model's is more than twice the gold's and over 0.5.

Every evaluation appends its rows (step, id, task, prompt, reply, gold, answer, right, exact,
format, score) to ``logs/heldout_completions.jsonl`` and logs the best and worst few. Without a
tokenizer, the rows' answers or a workflow's ``reward_fn``, only ``eval/score`` is measured.
The reward function is called here, in the trainer's process, a few times a reply (it is cheap
and pure for the rule rewards this applies to); a call that raises counts as not paid.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from pathlib import Path
from typing import Any

from arealite.api.config.run import EvaluatorConfig
from arealite.api.engine_api import InferenceEngine
from arealite.api.workflow_api import RolloutWorkflow
from arealite.observe import heldout_grading as hg

logger = logging.getLogger(__name__)
COMPLETIONS_FILE = "heldout_completions.jsonl"
RESERVED = frozenset({"prompt", "completion", "prompt_ids", "completion_ids"})
SHOWN_CHARS = 160


def evaluate(engine: InferenceEngine, workflow: RolloutWorkflow, rows: list[dict[str, Any]],
             config: EvaluatorConfig, tokenizer: Any = None, sample_workflow: RolloutWorkflow | None = None,
             log_dir: str | Path | None = None, step: int | None = None) -> dict[str, float]:
    """The held-out figures of the module docstring over ``rows`` (``config.max_prompts`` of
    them); ``sample_workflow`` samples ``pass_n`` replies a row for pass@k."""
    rows = rows[: config.max_prompts] if config.max_prompts else rows
    if not rows:
        return {}
    batch = engine.rollout_batch(rows, workflow)
    out = {"eval/score": batch["rewards"].float().mean().item(), "eval/n": float(len(rows))}
    reward_fn = getattr(workflow, "reward_fn", None)
    key = config.answer_key
    if tokenizer is None or reward_fn is None or "sample_ids" not in batch or not all(key in r for r in rows):
        return out
    by_id = {r["id"]: r for r in rows}
    graded = grade_batch(batch, tokenizer, by_id, reward_fn, config)
    out.update(summarize(graded, by_id, config))
    if sample_workflow is not None and config.pass_k:
        sampled = grade_batch(engine.rollout_batch(rows, sample_workflow), tokenizer, by_id,
                              reward_fn, config)
        out.update(pass_at_k_stats(sampled, by_id, config.pass_k))
    if log_dir is not None:
        path = Path(log_dir) / COMPLETIONS_FILE
        write_rows(path, graded, step)
        out["eval/rows_written"] = float(len(graded))
    for line in show_rows(graded, config.rows_shown, step):
        logger.info(line)
    return out


def grade_batch(batch: dict[str, Any], tokenizer: Any, by_id: dict[Any, dict[str, Any]],
                reward_fn: Any, config: EvaluatorConfig) -> list[dict[str, Any]]:
    """One record per trajectory: its row's id, the prompt, the reply, the gold and the grade."""
    out = []
    templates: dict[Any, hg.Template | None] = {}
    rewards = batch["rewards"].reshape(-1).tolist()
    for i, sid in enumerate(batch["sample_ids"].reshape(-1).tolist()):
        row = by_id.get(sid)
        if row is None:
            continue
        ids = batch["input_ids"][i]
        end = int(batch["attention_mask"][i].sum()) if "attention_mask" in batch else len(ids)
        trained = batch["loss_mask"][i].bool().nonzero()
        first = int(trained[0]) if len(trained) else end
        prompt_ids, reply_ids = ids[:first].tolist(), ids[first:end].tolist()
        prompt = tokenizer.decode(prompt_ids, skip_special_tokens=False)
        reply = tokenizer.decode(reply_ids, skip_special_tokens=True)
        gold = str(row[config.answer_key])
        pays = _payer(reward_fn, prompt, prompt_ids, row)
        if sid not in templates:
            templates[sid] = hg.gold_template(gold, pays, config.full_credit)
        g = hg.grade(reply, gold, float(rewards[i]), pays, config.full_credit, templates[sid])
        out.append({"id": sid, "task": row.get("task"), "prompt": prompt, "reply": reply,
                    "gold": gold, "answer": g.answer, "right": g.right, "exact": g.exact,
                    "format": g.format, "score": g.score})
    return out


def _payer(reward_fn: Any, prompt: str, prompt_ids: list[int], row: dict[str, Any]) -> hg.Pays:
    kwargs = {k: v for k, v in row.items() if k not in RESERVED}

    def pays(completion: str) -> float | None:
        try:
            return float(reward_fn(prompt, completion, list(prompt_ids), [], **kwargs))
        except Exception as e:  # noqa: BLE001 - a grader that fails pays nothing; said once a call
            logger.warning("eval: the reward function raised %s on %r: %s", type(e).__name__,
                           completion[:80], e)
            return None

    return pays


def summarize(graded: list[dict[str, Any]], by_id: dict[Any, dict[str, Any]],
              config: EvaluatorConfig) -> dict[str, float]:
    """right / exact / format / majority shares, overall and per task (``eval/<task>/...``);
    ``eval/collapse`` and a warning where the replies collapsed onto one answer."""
    groups: dict[str | None, list[dict[str, Any]]] = {None: graded}
    tasks = {rec["task"] for rec in graded if rec["task"] is not None}
    if len(tasks) > 1:
        for rec in graded:
            groups.setdefault(rec["task"], []).append(rec)
    out: dict[str, float] = {}
    for task, recs in groups.items():
        pre = "eval/" if task is None else f"eval/{task}/"
        gold = [hg.normalize((hg.gold_span(str(by_id[r["id"]][config.answer_key])) or ("",))[0])
                for r in recs]
        share, top = hg.majority_share([r["answer"] for r in recs])
        gold_share, _ = hg.majority_share(gold)
        collapse = hg.is_collapse(share, gold_share)
        out.update({f"{pre}right": hg.mean([float(r["right"]) for r in recs]),
                    f"{pre}exact": hg.mean([float(r["exact"]) for r in recs]),
                    f"{pre}format": hg.mean([float(r["format"]) for r in recs]),
                    f"{pre}majority_share": share, f"{pre}gold_majority_share": gold_share,
                    f"{pre}collapse": float(collapse)})
        if task is not None:
            out[f"{pre}score"] = hg.mean([r["score"] for r in recs])
            out[f"{pre}n"] = float(len(recs))
        if collapse:
            logger.warning("eval: COLLAPSE%s: %.0f%% of held-out replies answer %r (the gold "
                           "answers' most common one is %.0f%% of them)",
                           "" if task is None else f" on {task}", 100 * share, top, 100 * gold_share)
    return out


def pass_at_k_stats(sampled: list[dict[str, Any]], by_id: dict[Any, dict[str, Any]],
                    k: int) -> dict[str, float]:
    """The mean over rows of ``pass_at_k`` of ``right`` and of ``exact`` (rows with fewer than
    ``k`` finished samples are left out and counted)."""
    per_row: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for rec in sampled:
        per_row[rec["id"]].append(rec)
    full = [recs for recs in per_row.values() if len(recs) >= k]
    out = {f"eval/pass@{k}_rows": float(len(full))}
    for name in ("right", "exact"):
        vals = [hg.pass_at_k(len(recs), sum(r[name] for r in recs), k) for recs in full]
        out[f"eval/pass@{k}" + ("" if name == "right" else "_exact")] = hg.mean(vals)
    return out


def write_rows(path: Path, graded: list[dict[str, Any]], step: int | None) -> None:
    """Append one JSON line per reply, tagged with the evaluation's step."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for rec in graded:
            f.write(json.dumps({"step": step, **rec}, default=str) + "\n")


def show_rows(graded: list[dict[str, Any]], n: int, step: int | None) -> list[str]:
    """``n`` best and ``n`` worst replies (by exact, right, score), one line each."""
    if n <= 0 or not graded:
        return []
    order = sorted(range(len(graded)), key=lambda i: (-graded[i]["exact"], -graded[i]["right"],
                                                      -graded[i]["score"], i))
    picked = order[:n] + [i for i in order[-n:] if i not in order[:n]]
    lines = []
    for i in picked:
        r = graded[i]
        lines.append(f"held-out (step {step}) {'best ' if i in order[:n] else 'worst'} "
                     f"right {int(r['right'])} exact {int(r['exact'])} format {int(r['format'])} "
                     f"score {r['score']:.2f} | gold {r['gold'][:40]!r} -> {r['reply'][:SHOWN_CHARS]!r}")
    return lines
