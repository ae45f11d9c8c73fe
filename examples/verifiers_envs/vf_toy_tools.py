"""A tool-calling verifiers environment: the toy multiplication task (arealite.demo.toy_tools's
JSONL rows, ``{"id", "question": "What is 47 * 8?", "answer": "376"}``) where the model has a
calculator, served the way verifiers serves tools: an MCP ``Toolset`` with one tool,
``calc(expr)`` (arealite.demo.toy_tools.calculate: integer ``+ - *``), shared by every task of
the taskset (one server process for the environment, not one per episode). The harness's chat
loop lists the tool, sends it with every model call, runs each call the model makes over MCP
and feeds the result back, until the model answers without a call.

The reward ``correct`` is 1.0 when the final reply, stripped, is the row's answer (the rule of
``examples/tool_agent/agent.py``), else 0.0; the metric ``used_tool`` is 1.0 when the model
called ``calc`` at least once (a behaviour rate, not accuracy). Taskset id: ``vf_toy_tools``.

Run as a module (``python -m vf_toy_tools``), this file is the tool server itself: verifiers'
subprocess runtime starts it that way.
"""

from __future__ import annotations

import json
from pathlib import Path

import verifiers.v1 as vf

from arealite.demo.toy_tools import calculate

__all__ = ["CalcToolset", "ToyToolsTaskset"]


class CalcToolset(vf.Toolset[vf.SharedToolsetConfig]):
    # None: the tool is advertised bare as ``calc`` (not ``<server>_calc``), the name the
    # toy tool traces (arealite.demo.toy_tools.TOOLS) teach the model
    TOOL_PREFIX = None

    @vf.tool
    def calc(self, expr: str) -> str:
        """Evaluate an arithmetic expression such as 47*8."""
        return calculate(expr)


class ToyToolsData(vf.TaskData):
    answer: str


class ToyToolsTask(vf.Task[ToyToolsData]):
    @vf.reward
    async def correct(self, task: ToyToolsData, trace: vf.Trace) -> float:
        return float((trace.last_reply or "").strip() == task.answer)

    @vf.metric
    async def used_tool(self, trace: vf.Trace) -> float:
        return float(any(m.tool_calls for m in trace.assistant_messages))


class ToyToolsTasksetConfig(vf.TasksetConfig):
    path: str = ""
    """A toy_tools JSONL file (``arealite.demo.toy_tools.write_toy_tools`` writes them)."""


class ToyToolsTaskset(vf.Taskset[ToyToolsTask, ToyToolsTasksetConfig]):
    @classmethod
    def toolsets(cls, config: ToyToolsTasksetConfig) -> list[vf.Toolset]:
        return [CalcToolset(vf.SharedToolsetConfig())]

    def load(self):
        if not self.config.path:
            raise ValueError("taskset.path: the toy_tools JSONL file to load")
        for line in Path(self.config.path).read_text().splitlines():
            row = json.loads(line)
            yield ToyToolsTask(
                ToyToolsData(id=str(row["id"]), prompt=row["question"], answer=row["answer"]),
                self.config.task,
            )


if __name__ == "__main__":
    CalcToolset.run()
