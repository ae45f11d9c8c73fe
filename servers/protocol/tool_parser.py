"""Tool calls in model text, in the Qwen2.5 / Hermes format (SGLang's ``--tool-call-parser qwen25``).

A model announces a call with ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``.
As SGLang's ``Qwen25Detector`` does: the content is the text before the first ``<tool_call>\\n``
(stripped); each complete block whose JSON parses and names a tool of the request becomes one
call with its arguments re-serialised as a JSON string; a block that does not parse, or names an
unknown tool, is dropped; an unclosed block is dropped. The finish reason becomes
``tool_calls`` when at least one call parsed and the model stopped on its own.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

PARSERS = ("qwen25",)  # the formats --tool-call-parser accepts
BOT = "<tool_call>\n"
EOT = "\n</tool_call>"
_BLOCK = re.compile(re.escape(BOT) + r"(.*?)" + re.escape(EOT), re.DOTALL)


@dataclass
class ParsedToolCalls:
    content: str  # the text that is not a tool call
    calls: list[dict[str, Any]]  # OpenAI tool_calls entries: id, index, type, function


def tool_names(tools: list[dict[str, Any]] | None) -> set[str]:
    names = set()
    for t in tools or []:
        fn = t.get("function") if isinstance(t, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            names.add(fn["name"])
    return names


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"  # SGLang's id for every parser but Kimi's


def parse_tool_calls(text: str, tools: list[dict[str, Any]] | None) -> ParsedToolCalls:
    """Split ``text`` into content and tool calls (no call when no ``<tool_call>`` block)."""
    idx = text.find(BOT)
    if idx < 0:
        return ParsedToolCalls(text, [])
    known = tool_names(tools)
    calls: list[dict[str, Any]] = []
    for block in _BLOCK.findall(text):
        try:
            obj = json.loads(block.strip())
        except json.JSONDecodeError as e:
            logger.warning("dropping a tool call that is not JSON (%s): %.200r", e, block)
            continue
        for act in obj if isinstance(obj, list) else [obj]:
            name = act.get("name") if isinstance(act, dict) else None
            if not (isinstance(name, str) and name in known):
                logger.warning("dropping a call of an undefined function: %r", name)
                continue
            args = act.get("parameters") or act.get("arguments") or {}
            calls.append({
                "id": new_call_id(), "index": len(calls), "type": "function",
                "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
            })
    return ParsedToolCalls(text[:idx].strip(), calls)


def held_back(text: str, markers: list[str]) -> int:
    """How many trailing characters of streamed ``text`` to hold back: the longest tail that
    is a proper prefix of one of ``markers`` (a stop string or ``<tool_call>``), which a later
    token may complete."""
    keep = 0
    for m in markers:
        for k in range(min(len(m) - 1, len(text)), keep, -1):
            if text.endswith(m[:k]):
                keep = k
                break
    return keep
