"""Held-out evaluation with our own grader (``evaluator.eval_fn: evaluate:evaluate``).

The trainer calls it every ``evaluator.freq_steps`` steps, with no training episode in flight,
and logs its time as ``timeperf/eval`` apart from training time.
"""

from options import TaskOptions
from reward import grade


def evaluate(engine, rows, *, workflow, tokenizer, config) -> dict[str, float]:
    opts: TaskOptions = config.extra  # our own options, validated at start-up
    rows = rows[: opts.eval_rows]
    # One greedy sample per row through the evaluation workflow; rows carry an `id`, so each
    # trajectory says which row it answers.
    batch = engine.rollout_batch(rows, workflow)
    answers = {row["id"]: row["answer"] for row in rows}
    correct = []
    for ids, mask, row_id in zip(batch["input_ids"], batch["loss_mask"], batch["sample_ids"]):
        completion = tokenizer.decode(ids[mask.bool()], skip_special_tokens=True)
        correct.append(grade(completion, answers[int(row_id)]))
    return {"accuracy": sum(correct) / len(correct), "n": float(len(correct))}
