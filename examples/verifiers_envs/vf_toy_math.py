"""A single-turn verifiers environment on the toy arithmetic task (arealite.demo.toy_math's
JSONL rows, ``{"id", "question", "answer": "... #### N"}``), written the way any verifiers
environment is: typed task data, a task with its reward, a taskset that loads the rows. Its
taskset id is ``vf_toy_math`` (verifiers imports environments as top-level modules: this folder
goes on the path, ``kwargs.env_paths``).

The reward ``correct`` is 1.0 when the first ``#### N`` of the model's reply is the row's
``N`` (the same rule as arealite's ``toy_reward``), else 0.0; the metric ``has_answer`` is
whether the reply has a ``#### N`` at all (a format rate, not accuracy).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import verifiers.v1 as vf

__all__ = ["ToyMathTaskset"]

_ANSWER = re.compile(r"####\s*(-?\d+)")


def final_number(text: str) -> str | None:
    m = _ANSWER.search(text or "")
    return m.group(1) if m else None


class ToyMathData(vf.TaskData):
    answer: str


class ToyMathTask(vf.Task[ToyMathData]):
    @vf.reward
    async def correct(self, task: ToyMathData, trace: vf.Trace) -> float:
        pred = final_number(trace.last_reply)
        return float(pred is not None and pred == final_number(task.answer))

    @vf.metric
    async def has_answer(self, trace: vf.Trace) -> float:
        return float(final_number(trace.last_reply) is not None)


class ToyMathTasksetConfig(vf.TasksetConfig):
    path: str = ""
    """A toy_math JSONL file (``arealite.demo.toy_math.write_toy_math`` writes them)."""


class ToyMathTaskset(vf.Taskset[ToyMathTask, ToyMathTasksetConfig]):
    def load(self):
        if not self.config.path:
            raise ValueError("taskset.path: the toy_math JSONL file to load")
        for line in Path(self.config.path).read_text().splitlines():
            row = json.loads(line)
            yield ToyMathTask(
                ToyMathData(id=str(row["id"]), prompt=row["question"], answer=row["answer"]),
                self.config.task,
            )
