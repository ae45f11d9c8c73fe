"""Anthropic Messages <-> chat translation (no server): blocks, tools, tool_choice, stop
reasons, and the streamed events as the ``anthropic`` SDK's own accumulator reads them."""

from __future__ import annotations

import pytest

from arealite.agent.chat import ChatRequestError
from arealite.agent.messages_api import events, from_chat, to_chat
from tests.support.chat_answers import chat_answer

TOOL = {"name": "calc", "description": "d", "input_schema": {"type": "object"}}


def test_blocks_become_the_chat_conversation():
    chat = to_chat(
        {
            "max_tokens": 9,
            "system": [{"type": "text", "text": "sys"}],
            "tools": [TOOL],
            "tool_choice": {"type": "any"},
            "messages": [
                {"role": "user", "content": "2+3?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "let me"},
                        {"type": "tool_use", "id": "t1", "name": "calc", "input": {"e": 1}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [{"type": "text", "text": "5"}],
                        },
                        {"type": "text", "text": "and now?"},
                    ],
                },
            ],
        }
    )
    assert [(m["role"], m["content"]) for m in chat["messages"]] == [
        ("system", "sys"),
        ("user", "2+3?"),
        ("assistant", "let me"),
        ("tool", "5"),
        ("user", "and now?"),
    ]
    assert chat["messages"][2]["tool_calls"][0]["function"] == {
        "name": "calc",
        "arguments": {"e": 1},
    }
    assert chat["messages"][3]["tool_call_id"] == "t1"
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {"name": "calc", "description": "d", "parameters": {"type": "object"}},
        }
    ]
    assert chat["tool_choice"] == "required" and chat["max_tokens"] == 9
    named = to_chat(
        {
            "max_tokens": 1,
            "messages": [{"role": "user", "content": "x"}],
            "tools": [TOOL],
            "tool_choice": {"type": "tool", "name": "calc"},
        }
    )
    assert named["tool_choice"] == {"type": "function", "function": {"name": "calc"}}


@pytest.mark.parametrize(
    "body, match",
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"max_tokens": 4, "messages": []}, "non-empty"),
        (
            {
                "max_tokens": 4,
                "stop_sequences": ["x"],
                "messages": [{"role": "user", "content": "x"}],
            },
            "stop_sequences",
        ),
        ({"max_tokens": 4, "messages": [{"role": "system", "content": "x"}]}, "role"),
        (
            {
                "max_tokens": 4,
                "messages": [
                    {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm"}]}
                ],
            },
            "'thinking'",
        ),
        (
            {
                "max_tokens": 4,
                "tools": [{"type": "web_search_20250305", "name": "web_search"}],
                "messages": [{"role": "user", "content": "x"}],
            },
            "web_search_20250305",
        ),
        (
            {
                "max_tokens": 4,
                "tool_choice": {"type": "maybe"},
                "messages": [{"role": "user", "content": "x"}],
            },
            "tool_choice",
        ),
    ],
)
def test_bad_requests_name_the_problem(body, match):
    with pytest.raises(ChatRequestError, match=match):
        to_chat(body)


@pytest.mark.parametrize(
    "reason, stop", [("stop", "end_turn"), ("length", "max_tokens"), ("tool_calls", "tool_use")]
)
def test_stop_reasons(reason, stop):
    assert from_chat(chat_answer("x", reason=reason))["stop_reason"] == stop


def test_streamed_events_rebuild_the_message_in_the_sdks_accumulator():
    pytest.importorskip("anthropic")
    from anthropic.lib.streaming._messages import accumulate_event

    msg = from_chat(chat_answer("hi", ['{"e": 1}', '{"e": [2, "x"]}'], "tool_calls"))
    assert [b["type"] for b in msg["content"]] == ["text", "tool_use", "tool_use"]
    snap, bufs = None, {}
    for e in events(msg):
        snap = accumulate_event(event=e, current_snapshot=snap, json_bufs=bufs)
    assert snap.content[0].text == "hi" and snap.stop_reason == "tool_use"
    assert [b.input for b in snap.content[1:]] == [{"e": 1}, {"e": [2, "x"]}]
    assert snap.usage.input_tokens == 5 and snap.usage.output_tokens == 3
