"""Forced output formats on the proxy: a chat body's ``response_format`` and forcing
``tool_choice`` become the grammar sampling params the servers enforce token by token
(``GenerationHyperparameters.json_schema`` / ``ebnf``, SGLang's ``/generate`` keys).

``response_format``: ``json_object`` is the schema ``{"type": "object"}`` and ``json_schema``
its ``schema``, as SGLang's chat route maps them; the servers' JSON whitespace flags apply.
``tool_choice`` ``"required"`` or a named function: one Qwen2.5 / Hermes call (the format
``arealite.agent.chat`` parses), ``<tool_call>\\n{"name": <name>, "arguments": <the tool's
parameters schema>}\\n</tool_call>``, one alternative per allowed tool. SGLang builds a forced
call as an EBNF grammar too (its function-call detectors' ``build_ebnf``); here xgrammar, the
servers' grammar engine, composes it and prints it as EBNF, so any server with an xgrammar
backend (ours, SGLang's default) compiles the same grammar.
"""

from __future__ import annotations

import json
from typing import Any

from arealite.agent.chat import BOT, EOT, ChatRequestError

# what closes a call after its arguments object: the outer object's brace, then EOT
_CALL_SUFFIX = "}" + EOT


def response_format_schema(rf: Any) -> str | None:
    """The JSON schema (as text) a chat ``response_format`` asks for; None for plain text."""
    if rf is None:
        return None
    kind = rf.get("type") if isinstance(rf, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return json.dumps({"type": "object"})
    if kind == "json_schema":
        spec = rf.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise ChatRequestError("response_format.json_schema.schema must be a JSON object")
        return json.dumps(schema)
    raise ChatRequestError(
        f"response_format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}"
    )


def forced_tools(choice: Any, tools: list[dict] | None) -> list[dict] | None:
    """The tools one of which the reply must call, or None when the call is not forced."""
    if choice in (None, "auto", "none"):
        return None
    if choice == "required":
        if not tools:
            raise ChatRequestError("tool_choice 'required' needs tools")
        return tools
    fn = choice.get("function") if isinstance(choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise ChatRequestError(
            "tool_choice must be 'none', 'auto', 'required' or "
            f"{{'type': 'function', 'function': {{'name': ...}}}}, got {choice!r}"
        )
    named = [t for t in tools or [] if t["function"]["name"] == name]
    if not named:
        raise ChatRequestError(f"tool_choice names {name!r}, which is not among the tools")
    return named


def tool_call_ebnf(tools: list[dict], any_whitespace: bool = True) -> str:
    """An EBNF grammar for exactly one call of one of ``tools`` in the Qwen2.5 format."""
    try:
        import xgrammar as xgr
    except ImportError:
        raise ChatRequestError(
            "forcing a tool call needs xgrammar on the proxy (make setup installs it)"
        ) from None

    def literal(text: str) -> Any:
        special = set(".^$*+?{}[]\\|()/")
        return xgr.Grammar.from_regex(
            "".join("\\" + c if c in special else ("\\n" if c == "\n" else c) for c in text)
        )

    calls = []
    for t in tools:
        fn = t["function"]
        schema = json.dumps(fn.get("parameters") or {"type": "object"})
        head = BOT + '{"name": ' + json.dumps(fn["name"]) + ', "arguments": '
        try:
            args = xgr.Grammar.from_json_schema(schema, any_whitespace=any_whitespace)
        except (RuntimeError, ValueError, TypeError) as e:
            raise ChatRequestError(f"tool {fn['name']!r}: its parameters schema: {e}") from None
        calls.append(xgr.Grammar.concat(literal(head), args, literal(_CALL_SUFFIX)))
    return str(calls[0] if len(calls) == 1 else xgr.Grammar.union(*calls))


def constraint(
    body: dict[str, Any], tools: list[dict] | None, any_whitespace: bool = True
) -> dict[str, str]:
    """The ``GenerationHyperparameters`` grammar fields for a chat body (empty: none)."""
    schema = response_format_schema(body.get("response_format"))
    forced = forced_tools(body.get("tool_choice"), tools)
    if forced is not None and schema is not None:
        raise ChatRequestError(
            "tool_choice 'required' or a named tool cannot be combined with response_format: "
            "the tool-call constraint and the output constraint cannot both be honored"
        )
    if forced is not None:
        return {"ebnf": tool_call_ebnf(forced, any_whitespace)}
    return {"json_schema": schema} if schema is not None else {}
