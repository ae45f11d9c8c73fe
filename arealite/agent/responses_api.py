"""OpenAI's Responses API (``POST /v1/responses``) on the agent proxy, as a translation onto its
chat path: a request becomes a chat-completions body, ``AgentProxy.chat`` generates and records
the turn (so the trajectory is the one the chat route records for the same conversation), and
its answer becomes a ``response`` object or its SSE events. Nothing here touches tokens.

Wire shapes are those of the ``openai`` SDK's ``types/responses`` (and vLLM's / SGLang's
``/v1/responses``): input items ``message`` (``input_text`` / ``output_text`` parts),
``function_call`` and ``function_call_output``; function tools ``{"type": "function", "name",
"parameters"}``; output items ``message`` (one ``output_text`` part) and ``function_call``
(``call_id`` is the id the agent answers with). A reply whose generation hit the token cap is
``status: "incomplete"`` with reason ``max_output_tokens``.

``previous_response_id`` continues a stored response: the session keeps what each response
added (its input and its reply; never its ``instructions``, which OpenAI does not carry over)
unless the request says ``store: false``. Streaming is answered after generation, as the event sequence OpenAI
sends (``response.created``, ``response.in_progress``, per output item ``output_item.added``,
then ``content_part.added`` / ``output_text.delta`` / ``output_text.done`` /
``content_part.done`` for text or ``function_call_arguments.delta`` / ``.done`` for a call,
``output_item.done``, and ``response.completed`` or ``response.incomplete``), each delta carrying
the whole text.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from arealite.agent.chat import ChatRequestError

_TEXT_PARTS = ("input_text", "output_text", "text")


class ResponseNotFound(KeyError):
    """``previous_response_id`` names no stored response of the session (a 404)."""


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for j, p in enumerate(content):
            if not (
                isinstance(p, dict)
                and p.get("type") in _TEXT_PARTS
                and isinstance(p.get("text"), str)
            ):
                kind = p.get("type") if isinstance(p, dict) else type(p).__name__
                raise ChatRequestError(
                    f"{where}.content[{j}]: only text parts are supported "
                    f"({list(_TEXT_PARTS)}), got {kind!r}"
                )
            out.append(p["text"])
        return "".join(out)
    raise ChatRequestError(f"{where}: content must be a string or a list of text parts")


def input_messages(items: Any) -> list[dict[str, Any]]:
    """Chat messages of a Responses ``input``: consecutive assistant messages and
    ``function_call`` items form one assistant turn, as the proxy's chat replies are."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise ChatRequestError("input must be a string or a non-empty list of items")
    out: list[dict[str, Any]] = []
    for i, it in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(it, dict):
            raise ChatRequestError(f"{where}: an item must be an object")
        kind = it.get("type", "message")
        if kind == "message":
            role = it.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise ChatRequestError(
                    f"{where}: role must be user, system, developer or assistant, got {role!r}"
                )
            text = _text(it.get("content"), where)
            last = out[-1] if out else None
            if (
                role == "assistant"
                and last
                and last["role"] == "assistant"
                and not last.get("tool_calls")
            ):
                last["content"] = (last["content"] or "") + text
            else:
                out.append({"role": role, "content": text})
        elif kind == "function_call":
            if not isinstance(it.get("name"), str) or not isinstance(it.get("call_id"), str):
                raise ChatRequestError(f"{where}: a function_call needs name and call_id")
            call = {
                "id": it["call_id"],
                "type": "function",
                "function": {"name": it["name"], "arguments": it.get("arguments") or "{}"},
            }
            last = out[-1] if out else None
            if last and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            if not isinstance(it.get("call_id"), str):
                raise ChatRequestError(f"{where}: a function_call_output needs call_id")
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": it["call_id"],
                    "content": _text(it.get("output"), where),
                }
            )
        else:
            raise ChatRequestError(
                f"{where}: item type {kind!r} is not supported by the proxy "
                "(message, function_call, function_call_output)"
            )
    return out


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise ChatRequestError("tools must be a list")
    out = []
    for i, t in enumerate(tools):
        if (
            not isinstance(t, dict)
            or t.get("type") != "function"
            or not isinstance(t.get("name"), str)
        ):
            kind = t.get("type") if isinstance(t, dict) else None
            raise ChatRequestError(
                f"tools[{i}]: only function tools "
                f"({{'type': 'function', 'name': ...}}) are supported, got {kind!r}"
            )
        # the chat body's function object, keys as the SDK's chat-completions model sends them
        fn = {
            k: t[k] for k in ("name", "description", "parameters", "strict") if t.get(k) is not None
        }
        out.append({"type": "function", "function": fn})
    return out or None


def _tool_choice(choice: Any) -> Any:
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if (
        isinstance(choice, dict)
        and choice.get("type") == "function"
        and isinstance(choice.get("name"), str)
    ):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise ChatRequestError(
        f"tool_choice must be auto, none, required or "
        f"{{'type': 'function', 'name': ...}}, got {choice!r}"
    )


def _response_format(text: Any) -> dict[str, Any] | None:
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        return {
            "type": "json_schema",
            "json_schema": {
                k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt
            },
        }
    raise ChatRequestError(
        f"text.format.type must be text, json_object or json_schema, got {fmt.get('type')!r}"
    )


# A stored response: (the response it continued or None, the messages it added: its input's
# and its reply). Each keeps only what it added, so a long chain costs its length, not its square.
Stored = tuple[str | None, list[dict[str, Any]]]


def history(stored: dict[str, Stored], rid: str) -> list[dict[str, Any]]:
    """The conversation through response ``rid`` (its reply included), without instructions."""
    parts = []
    cur: str | None = rid
    while cur is not None:
        if cur not in stored:
            raise ResponseNotFound(cur)
        cur, added = stored[cur]
        parts.append(added)
    return [dict(m) for part in reversed(parts) for m in part]


def to_chat(body: Any, stored: dict[str, Stored]) -> tuple[dict[str, Any], list[dict]]:
    """(the chat-completions body of a Responses request, the messages its ``input`` adds);
    ``stored``: the session's responses by id, for ``previous_response_id``."""
    if not isinstance(body, dict):
        raise ChatRequestError("the request body must be a JSON object")
    for key in ("conversation", "background", "prompt"):
        if body.get(key):
            raise ChatRequestError(f"{key!r} is not supported by the proxy")
    prev = body.get("previous_response_id")
    added = input_messages(body.get("input"))
    messages = (history(stored, prev) if prev is not None else []) + added
    if body.get("instructions"):
        if not isinstance(body["instructions"], str):
            raise ChatRequestError("instructions must be a string")
        messages.insert(0, {"role": "system", "content": body["instructions"]})
    chat: dict[str, Any] = {"messages": messages}
    tools = _tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    fmt = _response_format(body.get("text"))
    if fmt is not None:
        chat["response_format"] = fmt
    if "message.output_text.logprobs" in (body.get("include") or []) or body.get("top_logprobs"):
        chat["logprobs"] = True
    return chat, added


def from_chat(out: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """The ``response`` object of one proxy chat answer ``out``."""
    choice = out["choices"][0]
    msg = choice["message"]
    items: list[dict[str, Any]] = []
    if msg["content"]:
        lps = [
            {"token": c["token"], "bytes": c["bytes"], "logprob": c["logprob"], "top_logprobs": []}
            for c in (choice.get("logprobs") or {}).get("content") or []
        ]
        items.append(
            {
                "id": "msg_" + uuid.uuid4().hex,
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [
                    {
                        "type": "output_text",
                        "text": msg["content"],
                        "annotations": [],
                        "logprobs": lps,
                    }
                ],
            }
        )
    for c in msg["tool_calls"] or []:
        items.append(
            {
                "id": "fc_" + uuid.uuid4().hex,
                "type": "function_call",
                "status": "completed",
                "call_id": c["id"],
                "name": c["function"]["name"],
                "arguments": c["function"]["arguments"],
            }
        )
    usage = out["usage"]
    incomplete = choice["finish_reason"] == "length"
    return {
        "id": "resp_" + out["id"].removeprefix("chatcmpl-"),
        "object": "response",
        "created_at": out["created"],
        "model": out["model"],
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "error": None,
        "output": items,
        "instructions": body.get("instructions"),
        "previous_response_id": body.get("previous_response_id"),
        "max_output_tokens": body.get("max_output_tokens"),
        "tools": body.get("tools") or [],
        "tool_choice": body.get("tool_choice") or "auto",
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "text": body.get("text") or {"format": {"type": "text"}},
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "store": body.get("store", True),
        "metadata": body.get("metadata") or {},
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            # nothing is read from or written to a prompt cache the agent pays for; the
            # installed openai SDK's ResponseUsage requires both counts
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage["total_tokens"],
        },
        "completed_at": int(time.time()),
    }


def reply_message(resp: dict[str, Any]) -> dict[str, Any]:
    """The chat message of a response's output (what the next turn's input repeats)."""
    text = "".join(
        p["text"] for it in resp["output"] if it["type"] == "message" for p in it["content"]
    )
    calls = [
        {
            "id": it["call_id"],
            "type": "function",
            "function": {"name": it["name"], "arguments": it["arguments"]},
        }
        for it in resp["output"]
        if it["type"] == "function_call"
    ]
    msg: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        msg["tool_calls"] = calls
    return msg


def events(resp: dict[str, Any]) -> list[dict[str, Any]]:
    """The streamed events of a finished response, in OpenAI's order."""
    seq = iter(range(1 << 30))
    out: list[dict[str, Any]] = []

    def emit(kind: str, **fields: Any) -> None:
        out.append({"type": kind, "sequence_number": next(seq), **fields})

    opening = {
        **resp,
        "status": "in_progress",
        "output": [],
        "incomplete_details": None,
        "usage": None,
        "completed_at": None,
    }
    emit("response.created", response=opening)
    emit("response.in_progress", response=opening)
    for idx, item in enumerate(resp["output"]):
        ref = {"item_id": item["id"], "output_index": idx}
        if item["type"] == "message":
            part = item["content"][0]
            emit(
                "response.output_item.added",
                output_index=idx,
                item={**item, "status": "in_progress", "content": []},
            )
            emit(
                "response.content_part.added",
                **ref,
                content_index=0,
                part={**part, "text": "", "logprobs": []},
            )
            emit(
                "response.output_text.delta",
                **ref,
                content_index=0,
                delta=part["text"],
                logprobs=part["logprobs"],
            )
            emit(
                "response.output_text.done",
                **ref,
                content_index=0,
                text=part["text"],
                logprobs=part["logprobs"],
            )
            emit("response.content_part.done", **ref, content_index=0, part=part)
        else:
            emit(
                "response.output_item.added",
                output_index=idx,
                item={**item, "status": "in_progress", "arguments": ""},
            )
            emit("response.function_call_arguments.delta", **ref, delta=item["arguments"])
            emit(
                "response.function_call_arguments.done",
                **ref,
                arguments=item["arguments"],
            )
        emit("response.output_item.done", output_index=idx, item=item)
    emit(
        "response.incomplete" if resp["status"] == "incomplete" else "response.completed",
        response=resp,
    )
    return out


async def sse(resp: dict[str, Any]):
    for e in events(resp):
        yield f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode()
