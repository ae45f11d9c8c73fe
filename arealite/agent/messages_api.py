"""Anthropic's Messages API (``POST /v1/messages``, ``POST /v1/messages/count_tokens``) on the
agent proxy, as a translation onto its chat path: a request becomes a chat-completions body,
``AgentProxy.chat`` generates and records the turn (the trajectory the chat route records for
the same conversation), and its answer becomes a ``message`` or its SSE events.

Wire shapes are those of the ``anthropic`` SDK's types (and vLLM's / SGLang's ``/v1/messages``):
``system`` (a string or text blocks) is the chat's system message; a user message's
``tool_result`` blocks become ``tool`` messages (in order, before the user's text, which
Anthropic requires to follow them); an assistant message's ``text`` and ``tool_use`` blocks
become one assistant message with ``tool_calls``. Tools are ``{"name", "description",
"input_schema"}``; ``tool_choice`` ``auto`` / ``any`` / ``tool`` / ``none`` map to the chat's
``auto`` / ``required`` / named / ``none``. Stop reasons: ``stop`` -> ``end_turn``, ``length``
-> ``max_tokens``, ``tool_calls`` -> ``tool_use``.

``max_tokens`` is required (as Anthropic requires it) and can only lower the proxy's
``gconfig.max_new_tokens``; ``temperature`` / ``top_p`` / ``top_k`` / ``thinking`` are ignored
like the chat route's sampling fields (sampling is the trainer's ``gconfig``).
``stop_sequences``, images, documents and server tools are refused with a 400. Streaming is
answered after generation, as Anthropic's events (``message_start``, per block
``content_block_start`` / ``content_block_delta`` (``text_delta`` or ``input_json_delta``, the
whole text or arguments in one delta) / ``content_block_stop``, ``message_delta`` with the stop
reason and output tokens, ``message_stop``). Errors are Anthropic's shape:
``{"type": "error", "error": {"type": "invalid_request_error", "message": ...}}``.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse

from arealite.agent.chat import ChatRequestError

STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "abort": "end_turn",
}
_ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error"}


def error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse(
        {
            "type": "error",
            "error": {"type": _ERROR_TYPES.get(status, "api_error"), "message": message},
        },
        status_code=status,
    )


def _text_blocks(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for j, b in enumerate(content):
            if not (
                isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
            ):
                kind = b.get("type") if isinstance(b, dict) else type(b).__name__
                raise ChatRequestError(
                    f"{where}[{j}]: only text blocks are supported here, got {kind!r}"
                )
            out.append(b["text"])
        return "".join(out)
    raise ChatRequestError(f"{where}: must be a string or a list of text blocks")


def _user(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    if not isinstance(content, list):
        raise ChatRequestError(f"{where}.content must be a string or a list of blocks")
    out, text = [], []
    for j, b in enumerate(content):
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "tool_result":
            if not isinstance(b.get("tool_use_id"), str):
                raise ChatRequestError(f"{where}.content[{j}]: a tool_result needs tool_use_id")
            result = b.get("content")
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": b["tool_use_id"],
                    "content": ""
                    if result is None
                    else _text_blocks(result, f"{where}.content[{j}].content"),
                }
            )
        elif kind == "text" and isinstance(b.get("text"), str):
            text.append(b["text"])
        else:
            raise ChatRequestError(
                f"{where}.content[{j}]: block type {kind!r} is not supported "
                "by the proxy in a user message (text, tool_result)"
            )
    if text or not out:
        out.append({"role": "user", "content": "".join(text)})
    return out


def _assistant(content: Any, where: str) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    if not isinstance(content, list):
        raise ChatRequestError(f"{where}.content must be a string or a list of blocks")
    text, calls = [], []
    for j, b in enumerate(content):
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text" and isinstance(b.get("text"), str):
            text.append(b["text"])
        elif kind == "tool_use":
            if not isinstance(b.get("name"), str) or not isinstance(b.get("input", {}), dict):
                raise ChatRequestError(
                    f"{where}.content[{j}]: a tool_use needs name and an input object"
                )
            calls.append(
                {
                    "id": b.get("id"),
                    "type": "function",
                    "function": {"name": b["name"], "arguments": b.get("input") or {}},
                }
            )
        else:
            raise ChatRequestError(
                f"{where}.content[{j}]: block type {kind!r} is not supported "
                "by the proxy in an assistant message (text, tool_use)"
            )
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
    if calls:
        msg["tool_calls"] = calls
    return msg


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise ChatRequestError("tools must be a list")
    out = []
    for i, t in enumerate(tools):
        if (
            not isinstance(t, dict)
            or t.get("type", "custom") != "custom"
            or not isinstance(t.get("name"), str)
            or not isinstance(t.get("input_schema"), dict)
        ):
            kind = t.get("type") if isinstance(t, dict) else None
            raise ChatRequestError(
                f"tools[{i}]: only client tools ({{'name', 'input_schema'}}) "
                f"are supported, got type {kind!r}"
            )
        fn = {"name": t["name"]}
        if t.get("description") is not None:
            fn["description"] = t["description"]
        fn["parameters"] = t["input_schema"]
        out.append({"type": "function", "function": fn})
    return out or None


def _tool_choice(choice: Any) -> Any:
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind in ("auto", "none"):
        return kind
    if kind == "any":
        return "required"
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise ChatRequestError(
        f"tool_choice must be {{'type': 'auto' | 'any' | 'none'}} or "
        f"{{'type': 'tool', 'name': ...}}, got {choice!r}"
    )


def to_chat(body: Any, count_only: bool = False) -> dict[str, Any]:
    """The chat-completions body of a Messages request."""
    if not isinstance(body, dict):
        raise ChatRequestError("the request body must be a JSON object")
    cap = body.get("max_tokens")
    if not count_only and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
        raise ChatRequestError(f"max_tokens: a positive integer is required, got {cap!r}")
    if body.get("stop_sequences"):
        raise ChatRequestError("stop_sequences are not supported by the proxy")
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ChatRequestError("messages must be a non-empty list")
    chat_msgs: list[dict[str, Any]] = []
    if body.get("system"):
        chat_msgs.append({"role": "system", "content": _text_blocks(body["system"], "system")})
    for i, m in enumerate(msgs):
        role = m.get("role") if isinstance(m, dict) else None
        if role == "user":
            chat_msgs += _user(m.get("content"), f"messages[{i}]")
        elif role == "assistant":
            chat_msgs.append(_assistant(m.get("content"), f"messages[{i}]"))
        else:
            raise ChatRequestError(f"messages[{i}]: role must be user or assistant, got {role!r}")
    chat: dict[str, Any] = {"messages": chat_msgs}
    if not count_only:
        chat["max_tokens"] = cap
    tools = _tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    return chat


def from_chat(out: dict[str, Any]) -> dict[str, Any]:
    """The ``message`` object of one proxy chat answer ``out``."""
    msg = out["choices"][0]["message"]
    blocks: list[dict[str, Any]] = []
    if msg["content"]:
        blocks.append({"type": "text", "text": msg["content"]})
    for c in msg["tool_calls"] or []:
        blocks.append(
            {
                "type": "tool_use",
                "id": "toolu_" + c["id"].removeprefix("call_"),
                "name": c["function"]["name"],
                "input": json.loads(c["function"]["arguments"]),
            }
        )
    return {
        "id": "msg_" + out["id"].removeprefix("chatcmpl-"),
        "type": "message",
        "role": "assistant",
        "model": out["model"],
        "content": blocks,
        "stop_reason": STOP_REASONS.get(out["choices"][0]["finish_reason"], "end_turn"),
        "stop_sequence": None,
        "usage": {
            "input_tokens": out["usage"]["prompt_tokens"],
            "output_tokens": out["usage"]["completion_tokens"],
        },
    }


def events(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The streamed events of a finished message, in Anthropic's order."""
    out: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {
                **message,
                "content": [],
                "stop_reason": None,
                "usage": {**message["usage"], "output_tokens": 0},
            },
        }
    ]
    for idx, b in enumerate(message["content"]):
        if b["type"] == "text":
            start, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": b["text"]}
        else:
            start = {**b, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(b["input"])}
        out += [
            {"type": "content_block_start", "index": idx, "content_block": start},
            {"type": "content_block_delta", "index": idx, "delta": delta},
            {"type": "content_block_stop", "index": idx},
        ]
    out += [
        {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": message["usage"]["output_tokens"]},
        },
        {"type": "message_stop"},
    ]
    return out


async def sse(message: dict[str, Any]):
    for e in events(message):
        yield f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode()
