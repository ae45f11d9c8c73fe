"""Chat messages as the proxy sees them: checked, normalised, compared, rendered, and tool calls
read back out of generated text.

The proxy applies the chat template itself (the server only sees token ids), so this module is
the client-side twin of the embedded server's ``/v1`` message handling: ``servers/`` and
``arealite/`` share only the wire protocol, never code. Tool calls use the Qwen2.5 / Hermes
``<tool_call>\\n{json}\\n</tool_call>`` format, parsed by SGLang's ``qwen25`` rules (content is
the text before the first block; blocks that are not JSON or name an unknown tool are dropped).
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

ROLES = ("system", "developer", "user", "assistant", "tool")
BOT, EOT = "<tool_call>\n", "\n</tool_call>"
_BLOCK = re.compile(re.escape(BOT) + r"(.*?)" + re.escape(EOT), re.DOTALL)
MARKER = "\x00AREALITE_ASSISTANT_MARKER\x00"


class ChatRequestError(ValueError):
    """A request the proxy cannot serve (a 400 in OpenAI's error shape)."""


def _text(content: Any, where: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if not (
                isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            ):
                raise ChatRequestError(f"{where}: only text content parts are supported")
            parts.append(p["text"])
        return "".join(parts)
    raise ChatRequestError(f"{where}: content must be a string or a list of text parts")


def _call(call: Any, where: str) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ChatRequestError(f"{where}: a tool call needs function.name")
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            raise ChatRequestError(f"{where}: function.arguments is not valid JSON ({e})") from None
    return {
        "id": call.get("id"),
        "type": "function",
        "function": {"name": fn["name"], "arguments": {} if args is None else args},
    }


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """Messages as a chat template reads them (tool-call arguments parsed from JSON)."""
    if not isinstance(messages, list) or not messages:
        raise ChatRequestError("messages must be a non-empty list")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ChatRequestError(f"{where}: 'role' must be one of {list(ROLES)}")
        msg: dict[str, Any] = {"role": m["role"], "content": _text(m.get("content"), where)}
        if m["role"] == "tool":
            msg["tool_call_id"] = m.get("tool_call_id")
        if m["role"] == "assistant" and m.get("tool_calls"):
            msg["tool_calls"] = [
                _call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(m["tool_calls"])
            ]
        elif msg["content"] is None and m["role"] != "assistant":
            raise ChatRequestError(f"{where}: content is required for role {m['role']!r}")
        out.append(msg)
    return out


def same_message(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal for the conversation: role, content (None == ""), tool calls by name and
    arguments, tool results by content (ids are the agent's bookkeeping)."""
    if a["role"] != b["role"] or (a.get("content") or "") != (b.get("content") or ""):
        return False
    calls_a = [
        (c["function"]["name"], c["function"]["arguments"]) for c in a.get("tool_calls") or []
    ]
    calls_b = [
        (c["function"]["name"], c["function"]["arguments"]) for c in b.get("tool_calls") or []
    ]
    return calls_a == calls_b


def template_view(messages: list[dict]) -> list[dict]:
    """Messages as handed to the chat template: an assistant turn's None content becomes ``""``,
    as SGLang's chat route does, since templates that concatenate ``message['content']`` (e.g.
    SmolLM2's) cannot render None; templates that test it (``if message.content``) render both
    alike."""
    return [
        {**m, "content": ""} if m["role"] == "assistant" and m.get("content") is None else m
        for m in messages
    ]


def render(tokenizer: Any, messages: list[dict], tools: list | None, generation: bool) -> str:
    if getattr(tokenizer, "chat_template", None) is None:
        raise ChatRequestError("the tokenizer has no chat template")
    try:
        return tokenizer.apply_chat_template(
            template_view(messages),
            tools=tools or None,
            tokenize=False,
            add_generation_prompt=generation,
        )
    except Exception as e:  # a template that rejects the conversation
        raise ChatRequestError(f"the chat template cannot render these messages: {e}") from None


def encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False)) if text else []


def assistant_close(tokenizer: Any) -> str:
    """What the template writes after an assistant turn's content (e.g. ``<|im_end|>\\n``)."""
    conv = [{"role": "user", "content": "q"}, {"role": "assistant", "content": MARKER}]
    text = render(tokenizer, conv, None, generation=False)
    if MARKER not in text:
        raise ChatRequestError("the chat template does not render assistant content")
    return text[text.rindex(MARKER) + len(MARKER) :]


def parse_tool_calls(text: str, tools: list | None) -> tuple[str | None, list[dict[str, Any]]]:
    """(content, OpenAI ``tool_calls``) of generated ``text``; no calls without ``tools``."""
    idx = text.find(BOT) if tools else -1
    if idx < 0:
        return text, []
    known = {
        t["function"]["name"]
        for t in tools
        if isinstance(t, dict) and isinstance(t.get("function"), dict) and "name" in t["function"]
    }
    calls: list[dict[str, Any]] = []
    for block in _BLOCK.findall(text):
        try:
            obj = json.loads(block.strip())
        except json.JSONDecodeError:
            continue
        for act in obj if isinstance(obj, list) else [obj]:
            name = act.get("name") if isinstance(act, dict) else None
            if isinstance(name, str) and name in known:
                args = act.get("parameters") or act.get("arguments") or {}
                calls.append(
                    {
                        "id": f"call_{uuid.uuid4().hex[:24]}",
                        "index": len(calls),
                        "type": "function",
                        "function": {
                            "name": name,
                            "arguments": json.dumps(args, ensure_ascii=False),
                        },
                    }
                )
    if not calls:
        return text, []
    return (text[:idx].strip() or None), calls


def check_tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise ChatRequestError("tools must be a list")
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not (isinstance(fn, dict) and isinstance(fn.get("name"), str) and fn["name"]):
            raise ChatRequestError(
                f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}"
            )
    return tools or None
