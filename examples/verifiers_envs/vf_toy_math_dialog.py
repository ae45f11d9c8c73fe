"""A multi-turn verifiers environment: a scripted user asks two toy arithmetic questions in one
conversation (the second after the model has answered the first), as verifiers' own
``user-sim`` env drives a conversation, with plain Python in place of a modeled user.

Each task is two consecutive rows of a toy_math JSONL file. The environment (an ``Env`` with
one ``assistant`` role) opens an interaction with the task's first question as the prompt,
takes the model's reply, sends the second question as the next user turn and takes that reply.
The reward ``correct`` is the fraction of the two replies whose first ``#### N`` is right (0,
0.5 or 1: partial credit); the metric ``both_right`` is 1.0 when both are. Taskset id:
``vf_toy_math_dialog``.
"""

from __future__ import annotations

import json
from pathlib import Path

import verifiers.v1 as vf
from vf_toy_math import final_number  # the single-turn example, beside this one

__all__ = ["ToyMathDialogTaskset", "ToyMathDialogEnv"]


class DialogData(vf.TaskData):
    follow_up: str
    answers: list[str]


def right(replies: list[str], answers: list[str]) -> list[bool]:
    return [final_number(r) is not None and final_number(r) == final_number(a)
            for r, a in zip(replies, answers)]


class DialogTask(vf.Task[DialogData]):
    @vf.reward
    async def correct(self, task: DialogData, trace: vf.Trace) -> float:
        replies = [m.content or "" for m in trace.assistant_messages]
        return sum(right(replies, task.answers)) / len(task.answers)

    @vf.metric
    async def both_right(self, task: DialogData, trace: vf.Trace) -> float:
        replies = [m.content or "" for m in trace.assistant_messages]
        return float(len(replies) == 2 and all(right(replies, task.answers)))


class DialogTasksetConfig(vf.TasksetConfig):
    path: str = ""
    """A toy_math JSONL file; rows 2k and 2k+1 make task k."""


class ToyMathDialogTaskset(vf.Taskset[DialogTask, DialogTasksetConfig]):
    def load(self):
        if not self.config.path:
            raise ValueError("taskset.path: the toy_math JSONL file to load")
        rows = [json.loads(x) for x in Path(self.config.path).read_text().splitlines()]
        for a, b in zip(rows[0::2], rows[1::2]):
            yield DialogTask(
                DialogData(id=f"{a['id']}+{b['id']}", prompt=a["question"],
                           follow_up=b["question"], answers=[a["answer"], b["answer"]]),
                self.config.task,
            )


class DialogEnvConfig(vf.EnvConfig):
    assistant: vf.AgentConfig = vf.AgentConfig()


class ToyMathDialogEnv(vf.Env[DialogEnvConfig]):
    async def run(self, task, agents):
        async with agents.assistant.interaction(task) as chat:
            first = await chat.turn()  # a prompted task: the model answers the prompt
            if not first.terminated:
                await chat.turn(task.data.follow_up)
