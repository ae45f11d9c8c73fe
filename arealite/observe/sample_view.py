"""A few of a step's samples on the console, with their rewards: what the model writes, seen
while it trains (``stats_logger.samples_every``). A task that does not learn shows why here
(the same reply to every prompt, a format the reward never matches) long before a curve does.

From the trajectory contract alone (``input_ids``, ``loss_mask``, ``rewards``): the prompt is
what precedes the first trained token, the reply everything from it on.
"""

from __future__ import annotations

from typing import Any

PROMPT_CHARS = 60  # the prompt's end: where the reply continues from
REPLY_CHARS = 160


def pick_rows(rewards: list[float], n: int) -> list[int]:
    """Rows to show: the best and the worst of the step, then the ones between (at most n)."""
    order = sorted(range(len(rewards)), key=lambda i: (-rewards[i], i))
    if n <= 0 or not order:
        return []
    picked = [order[0]] + ([order[-1]] if n > 1 and len(order) > 1 else [])
    for i in order[1:-1]:
        if len(picked) >= n:
            break
        picked.insert(-1, i)
    return picked


def _clip(text: str, n: int, keep_end: bool) -> str:
    if len(text) <= n:
        return repr(text)
    return repr("…" + text[-n:]) if keep_end else repr(text[:n] + "…")


def format_samples(batch: dict[str, Any], tokenizer: Any, step: int, n: int) -> list[str]:
    """One line per shown sample: ``sample (step s) reward r | 'prompt end' -> 'reply'``."""
    if n <= 0 or not all(k in batch for k in ("input_ids", "loss_mask", "rewards")):
        return []  # not a trajectory batch (a trainer's own stats only)
    rewards = [float(r) for r in batch["rewards"].reshape(-1).tolist()]
    lines = []
    for i in pick_rows(rewards, n):
        ids = batch["input_ids"][i]
        mask = batch["loss_mask"][i].bool()
        end = int(batch["attention_mask"][i].sum()) if "attention_mask" in batch else len(ids)
        trained = mask.nonzero()
        first = int(trained[0]) if len(trained) else end
        prompt = tokenizer.decode(ids[:first].tolist(), skip_special_tokens=True)
        reply = tokenizer.decode(ids[first:end].tolist(), skip_special_tokens=True)
        lines.append(f"sample (step {step}) reward {rewards[i]:.3f} | "
                     f"{_clip(prompt, PROMPT_CHARS, keep_end=True)} -> "
                     f"{_clip(reply, REPLY_CHARS, keep_end=False)}")
    return lines
