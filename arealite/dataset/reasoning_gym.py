"""reasoning-gym as a data source: train and held-out rows of procedurally generated problems,
built offline and deterministically from task names, weights, sizes, each task's own config
(its difficulty knobs) and a seed.

Rows are JSONL-ready dicts read by ``arealite.dataset.loader`` like any dataset:
``{"id", "task", "task_config", "question", "answer", "metadata", "messages"}``. ``messages`` is
the prompt: reasoning-gym's own system prompt (``SYSTEM_PROMPTS[system_prompt]``, which says
how to give the answer), the task's question (which carries the task's own instructions) and,
with ``answer_prefix``, the start of the assistant's turn (``"<answer>"``: a small model that
ignores the instruction is put where the answer goes); the workflow renders it through the
model's chat template. ``workflows.rewards.reasoning_gym``
scores a completion with the task's own ``score_answer`` from ``task``, ``task_config``,
``answer`` and ``metadata``.

Few-shot (``shots=N``): each row's prompt puts N solved problems of the same task before its
question, as earlier user and assistant turns (the answer between the tags, as the system prompt
asks), so the prompt itself shows the required format and a rise in right answers under it is not
format learning. Each row draws its own N from a seeded pool of the task's problems that holds no
held-out question (a fixed set of examples invites copying one of their answers).

Splits: each task draws its train and held-out problems from differently seeded generators;
a train problem whose question also appears in held-out is skipped (small problem spaces repeat),
so the two never share a problem. A task whose problem space is smaller than its share of train
repeats its problems in turn (epochs over the space); held-out problems are always distinct (too
few of them is an error). Every row is checked at build time: the task's verifier must
give its own answer 1.0 after the JSON round trip the row goes through, so a task whose entries
do not survive JSON fails here, not as silent zeros in training.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SPLITS = ("train", "valid")


class UnknownTask(ValueError):
    """A task name reasoning-gym does not have; the message names the closest ones."""


@dataclass(frozen=True)
class TaskSpec:
    """One reasoning-gym task of a mix: its weight and its own config keys (difficulty)."""

    name: str
    weight: float = 1.0
    config: dict[str, Any] = field(default_factory=dict)


def task_names() -> list[str]:
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def check_task_names(names: list[str]) -> None:
    """Raise ``UnknownTask`` (one line, the closest known names) for the first unknown name."""
    known = task_names()
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
            hint = (
                f"closest: {', '.join(close)}"
                if close
                else f"known tasks include: {', '.join(known[:6])}, ..."
            )
            raise UnknownTask(f"unknown reasoning-gym task {name!r}; {hint}")


def parse_tasks(spec: str | list[Any] | dict[str, Any]) -> list[TaskSpec]:
    """``"chain_sum:2,basic_arithmetic"`` (name[:weight], comma separated), a list of names /
    ``{name, weight, config}`` dicts, or a ``{name: weight}`` dict -> checked ``TaskSpec``s."""
    items: list[TaskSpec] = []
    if isinstance(spec, str):
        for part in filter(None, (p.strip() for p in spec.split(","))):
            name, _, w = part.partition(":")
            items.append(TaskSpec(name.strip(), float(w) if w else 1.0))
    elif isinstance(spec, dict):
        items = [TaskSpec(k, float(v)) for k, v in spec.items()]
    else:
        for s in spec:
            items.append(
                TaskSpec(s)
                if isinstance(s, str)
                else TaskSpec(s["name"], float(s.get("weight", 1.0)), dict(s.get("config") or {}))
            )
    if not items:
        raise ValueError("no reasoning-gym task given")
    if len({t.name for t in items}) != len(items):
        raise ValueError("a reasoning-gym task is named twice")
    if any(t.weight <= 0 for t in items):
        raise ValueError("reasoning-gym task weights must be > 0")
    check_task_names([t.name for t in items])
    return items


def with_configs(tasks: list[TaskSpec], configs: str | dict[str, Any]) -> list[TaskSpec]:
    """``tasks`` with each one's config from ``configs`` (``{task: {key: value}}``, or that as
    JSON, as ``--configs`` takes it); ``ValueError`` for JSON that is not such an object."""
    table = json.loads(configs) if isinstance(configs, str) else configs
    if not isinstance(table, dict):
        raise ValueError(f"task configs must be a JSON object {{task: {{key: value}}}}, got {configs!r}")
    return [TaskSpec(t.name, t.weight, table.get(t.name, {})) for t in tasks]


def add_data_options(p: argparse.ArgumentParser, tasks: str | None, configs: str | None,
                     configs_help: str, seed_flag: str = "--seed") -> None:
    """The options that decide a data set's rows, as ``arealite rg-data`` and ``arealite
    real-model-job`` both take them (``tasks``: the default, None: required)."""
    p.add_argument("--tasks", required=tasks is None, default=tasks,
                   help="reasoning-gym task[:weight],... e.g. chain_sum:2,leg_counting")
    p.add_argument("--configs", default=configs, help=configs_help)
    p.add_argument("--n-train", type=int, default=2000)
    p.add_argument("--n-valid", type=int, default=200)
    p.add_argument(seed_flag, type=int, default=0)
    p.add_argument("--system-prompt", default="direct",
                   help="reasoning-gym's SYSTEM_PROMPTS entry put before each question")
    p.add_argument("--answer-prefix", default="<answer>",
                   help="the start of the model's reply, prefilled ('' for none)")
    p.add_argument("--shots", type=int, default=0,
                   help="solved problems of the same task before each question (few-shot)")


def _seed(seed: int, *parts: Any) -> int:
    h = hashlib.sha256(":".join(map(str, (seed, *parts))).encode()).digest()
    return int.from_bytes(h[:4], "big")


def _counts(tasks: list[TaskSpec], n: int, seed: int, split: str) -> list[int]:
    """How many of the split's ``n`` rows each task gets: row j's task is drawn by weight from
    an rng seeded by (seed, split), so the mix is the same on every machine."""
    rng = random.Random(_seed(seed, split, "mix"))
    picks = rng.choices(range(len(tasks)), weights=[t.weight for t in tasks], k=n)
    return [picks.count(i) for i in range(len(tasks))]


def make_dataset(task: str, config: dict[str, Any], size: int, seed: int):
    """The task's reasoning-gym dataset (its own generator and verifier)."""
    import reasoning_gym

    try:
        return reasoning_gym.create_dataset(task, size=size, seed=seed, **config)
    except TypeError as e:  # an unknown config key reaches the task's config dataclass
        raise ValueError(f"reasoning-gym task {task!r}: bad config {config}: {e}") from None


def _task_entries(
    t: TaskSpec, n: int, seed: int, split: str, avoid: set[str]
) -> list[dict[str, Any]]:
    if n == 0:
        return []
    size = 2 * n + 16  # spare problems for those skipped as held-out duplicates
    ds = make_dataset(t.name, t.config, size, _seed(seed, split, t.name))
    out, seen = [], set(avoid)
    for i in range(size):
        e = ds[i]
        if e["question"] in seen:
            continue
        seen.add(e["question"])
        entry = json.loads(
            json.dumps(
                {
                    "question": e["question"],
                    "answer": e["answer"],
                    "metadata": e.get("metadata", {}),
                }
            )
        )
        score = ds.score_answer(entry["answer"], entry)
        if score != 1.0:
            raise ValueError(
                f"reasoning-gym task {t.name!r}: its verifier scores its own answer "
                f"{score} after a JSON round trip; this task cannot be used as rows"
            )
        out.append(entry)
        if len(out) == n:
            return out
    if split == "shots" and len(out) > 1:  # a few-shot pool: as many distinct ones as there are
        return out
    if split == "train" and out:  # a small problem space: its problems again, in turn
        return [out[i % len(out)] for i in range(n)]
    raise ValueError(
        f"reasoning-gym task {t.name!r}: only {len(out)} distinct {split} problems "
        f"of {n}; raise its difficulty or ask for fewer"
    )


SHOT_POOL = 64  # solved problems a task's few-shot examples are drawn from


def _shot_turns(
    t: TaskSpec, entries: list[dict[str, Any]], shots: int, seed: int, split: str,
    held_out: set[str],
) -> list[list[dict[str, str]]]:
    """For each entry, ``shots`` solved problems of task ``t`` as user/assistant turns, drawn by
    a seeded rng from a pool that holds no ``held_out`` question and never the entry's own."""
    if shots <= 0:
        return [[] for _ in entries]
    pool = _task_entries(t, SHOT_POOL, seed, "shots", held_out)
    rng = random.Random(_seed(seed, split, "shots", t.name))
    out = []
    for e in entries:
        others = [p for p in pool if p["question"] != e["question"]]
        if len(others) < shots:
            raise ValueError(f"reasoning-gym task {t.name!r}: {len(others)} problems for "
                             f"{shots} few-shot examples; ask for fewer shots")
        picks = rng.sample(others, shots)
        out.append([turn for p in picks for turn in (
            {"role": "user", "content": p["question"]},
            {"role": "assistant", "content": f"<answer>{p['answer']}</answer>"},
        )])
    return out


def build_rows(
    tasks: list[TaskSpec],
    n: int,
    seed: int = 0,
    split: str = "train",
    system_prompt: str = "default",
    avoid: set[str] | None = None,
    answer_prefix: str = "",
    shots: int = 0,
) -> list[dict[str, Any]]:
    """``n`` rows of one split, in a seeded shuffled order. ``avoid``: questions to leave out
    (the held-out questions when building train). ``answer_prefix`` (e.g. ``"<answer>"``): the
    assistant turn starts with it, and the model continues from there (a prefill). ``shots``:
    solved problems of the row's task before its question (module docstring)."""
    from reasoning_gym.utils import SYSTEM_PROMPTS

    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
    if system_prompt not in SYSTEM_PROMPTS:
        raise ValueError(
            f"system_prompt must be one of {sorted(SYSTEM_PROMPTS)}, not {system_prompt!r}"
        )
    if shots < 0:
        raise ValueError(f"shots must be >= 0, not {shots}")
    rows = []
    for t, k in zip(tasks, _counts(tasks, n, seed, split)):
        entries = _task_entries(t, k, seed, split, avoid or set())
        # the pool avoids every held-out question: train's avoid set, or valid's own questions
        held_out = set(avoid or ()) | ({e["question"] for e in entries} if split == "valid" else set())
        for e, examples in zip(entries, _shot_turns(t, entries, shots, seed, split, held_out)):
            rows.append(
                {
                    "task": t.name,
                    "task_config": t.config,
                    **e,
                    "messages": [
                        {"role": "system", "content": SYSTEM_PROMPTS[system_prompt]},
                        *examples,
                        {"role": "user", "content": e["question"]},
                        *(
                            [{"role": "assistant", "content": answer_prefix}]
                            if answer_prefix
                            else []
                        ),
                    ],
                }
            )
    random.Random(_seed(seed, split, "order")).shuffle(rows)
    return [{"id": i, **r} for i, r in enumerate(rows)]


def write_reasoning_gym(
    out_dir: str | Path,
    tasks: list[TaskSpec],
    n_train: int = 2000,
    n_valid: int = 200,
    seed: int = 0,
    system_prompt: str = "default",
    answer_prefix: str = "",
    shots: int = 0,
) -> dict[str, Path]:
    """Write ``valid.jsonl`` and ``train.jsonl`` (no question in both) into ``out_dir``."""
    valid = build_rows(tasks, n_valid, seed, "valid", system_prompt, answer_prefix=answer_prefix,
                       shots=shots)
    train = build_rows(
        tasks,
        n_train,
        seed,
        "train",
        system_prompt,
        avoid={r["question"] for r in valid},
        answer_prefix=answer_prefix,
        shots=shots,
    )
    out = Path(out_dir)  # created only once every row is built and checked
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, rows in (("train", train), ("valid", valid)):
        paths[split] = out / f"{split}.jsonl"
        paths[split].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths
