"""Forced formats as grammars (no server): the chat fields they come from, and the forced call's
EBNF accepting exactly one call in the Qwen2.5 format, checked with xgrammar's own matcher."""

from __future__ import annotations

import json

import pytest

from arealite.agent.chat import ChatRequestError
from arealite.agent.forced import constraint
from tests.support.tool_model import TOOLS

OTHER = {
    "type": "function",
    "function": {
        "name": "echo",
        "parameters": {
            "type": "object",
            "properties": {"n": {"type": "integer"}},
            "required": ["n"],
        },
    },
}


def test_which_fields_become_which_grammar():
    assert constraint({}, TOOLS) == {} and constraint({"tool_choice": "auto"}, TOOLS) == {}
    assert constraint({"response_format": {"type": "json_object"}}, None) == {
        "json_schema": '{"type": "object"}'
    }
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    got = constraint(
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "v", "schema": schema},
            }
        },
        None,
    )
    assert json.loads(got["json_schema"]) == schema
    assert set(constraint({"tool_choice": "required"}, TOOLS)) == {"ebnf"}
    for body, match in [
        ({"tool_choice": "required"}, "needs tools"),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "'nope'"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "combined"),
    ]:
        with pytest.raises(ChatRequestError, match=match):
            constraint(body, TOOLS if "nope" in str(body) or "combined" in match else None)


def _accepts(ebnf: str, text: str) -> bool:
    xgr = pytest.importorskip("xgrammar")
    vocab = [chr(i) for i in range(32, 127)] + ["\n", "</s>"]
    info = xgr.TokenizerInfo(vocab, stop_token_ids=[len(vocab) - 1])
    m = xgr.GrammarMatcher(xgr.GrammarCompiler(info).compile_grammar(ebnf))
    ids = [vocab.index(c) for c in text]
    return all(m.accept_token(i) for i in ids) and m.accept_token(len(vocab) - 1)


@pytest.mark.parametrize(
    "choice, text, ok",
    [
        (
            "required",
            '<tool_call>\n{"name": "calc", "arguments": {"expr": "1+2"}}\n</tool_call>',
            True,
        ),
        ("required", '<tool_call>\n{"name": "echo", "arguments": {"n": 3}}\n</tool_call>', True),
        ("required", '<tool_call>\n{"name": "echo", "arguments": {"n": "3"}}\n</tool_call>', False),
        ("required", "5", False),
        (
            {"type": "function", "function": {"name": "echo"}},
            '<tool_call>\n{"name": "calc", "arguments": {"expr": "1"}}\n</tool_call>',
            False,
        ),
        (
            {"type": "function", "function": {"name": "echo"}},
            '<tool_call>\n{"name": "echo", "arguments": {"n": 3}}\n</tool_call>',
            True,
        ),
    ],
)
def test_the_forced_call_grammar(choice, text, ok):
    ebnf = constraint({"tool_choice": choice}, TOOLS + [OTHER])["ebnf"]
    assert _accepts(ebnf, text) is ok
