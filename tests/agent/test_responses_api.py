"""Responses API <-> chat translation (no server): input items, tools, formats, stored
conversations, and the streamed events as the ``openai`` SDK's own stream state reads them."""

from __future__ import annotations

import pytest

from arealite.agent.chat import ChatRequestError
from arealite.agent.responses_api import ResponseNotFound, events, from_chat, to_chat
from tests.support.chat_answers import chat_answer

CALC = {"type": "function", "name": "calc", "parameters": {"type": "object"}, "strict": True}


def test_items_become_the_chat_conversation():
    body = {
        "instructions": "be brief",
        "tools": [CALC],
        "tool_choice": {"type": "function", "name": "calc"},
        "max_output_tokens": 7,
        "text": {"format": {"type": "json_schema", "name": "v", "schema": {"type": "object"}}},
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "2+3?"}]},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "let me"}],
            },
            {"type": "function_call", "call_id": "c1", "name": "calc", "arguments": '{"e": 1}'},
            {"type": "function_call", "call_id": "c2", "name": "calc", "arguments": ""},
            {"type": "function_call_output", "call_id": "c1", "output": "5"},
        ],
    }
    chat, convo = to_chat(body, {})
    assert chat["messages"][0] == {"role": "system", "content": "be brief"}
    assert chat["messages"][1:] == convo  # no earlier response: the input is all of it
    # text and the calls after it are one assistant turn, as the proxy's reply was
    assert [m["role"] for m in convo] == ["user", "assistant", "tool"]
    assert convo[1]["content"] == "let me" and [c["id"] for c in convo[1]["tool_calls"]] == [
        "c1",
        "c2",
    ]
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {"name": "calc", "parameters": {"type": "object"}, "strict": True},
        }
    ]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "calc"}}
    assert chat["max_tokens"] == 7
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "v", "schema": {"type": "object"}},
    }


def test_previous_response_continues_without_its_instructions():
    stored = {
        "resp_1": (None, [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]),
        "resp_2": (
            "resp_1",
            [{"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}],
        ),
    }
    chat, added = to_chat(
        {"previous_response_id": "resp_2", "input": "e", "instructions": "new"}, stored
    )
    assert [m["content"] for m in chat["messages"]] == ["new", "a", "b", "c", "d", "e"]
    assert added == [{"role": "user", "content": "e"}]
    with pytest.raises(ResponseNotFound):
        to_chat({"previous_response_id": "resp_3", "input": "c"}, stored)


@pytest.mark.parametrize(
    "body, match",
    [
        ({"input": []}, "non-empty"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "'reasoning'"),
        ({"input": [{"role": "tool", "content": "x"}]}, "role"),
        ({"input": "x", "tools": [{"type": "file_search"}]}, "'file_search'"),
        ({"input": "x", "tool_choice": {"type": "web_search"}}, "tool_choice"),
        ({"input": "x", "text": {"format": {"type": "grammar"}}}, "text.format"),
        ({"input": "x", "background": True}, "background"),
    ],
)
def test_bad_requests_name_the_problem(body, match):
    with pytest.raises(ChatRequestError, match=match):
        to_chat(body, {})


def test_output_items_and_an_incomplete_reply():
    resp = from_chat(chat_answer("thinking", ['{"e": 1}']), {"input": "x"})
    assert resp["status"] == "completed" and resp["id"] == "resp_abc"
    assert [o["type"] for o in resp["output"]] == ["message", "function_call"]
    assert resp["output"][1]["call_id"] == "call_0" and resp["usage"]["total_tokens"] == 8
    cut = from_chat(chat_answer("abc", reason="length"), {"input": "x"})
    assert cut["status"] == "incomplete"
    assert cut["incomplete_details"] == {"reason": "max_output_tokens"}


def test_streamed_events_rebuild_the_response_in_the_sdks_stream_state():
    openai = pytest.importorskip("openai")
    from openai.lib.streaming.responses._responses import ResponseStreamState
    from openai.types.responses import ResponseStreamEvent

    resp = from_chat(chat_answer("hi", ['{"e": 1}', '{"e": 2}']), {"input": "x"})
    state = ResponseStreamState(input_tools=openai.NOT_GIVEN, text_format=openai.NOT_GIVEN)
    evs = events(resp)
    assert [e["sequence_number"] for e in evs] == list(range(len(evs)))
    for e in evs:
        state.handle_event(
            openai._models.construct_type_unchecked(type_=ResponseStreamEvent, value=e)
        )
    final = state._completed_response
    assert final.output_text == "hi"
    assert [o.arguments for o in final.output if o.type == "function_call"] == [
        '{"e": 1}',
        '{"e": 2}',
    ]


def test_output_text_logprobs_when_included():
    chat, _ = to_chat({"input": "x", "include": ["message.output_text.logprobs"]}, {})
    assert chat["logprobs"] is True and "logprobs" not in to_chat({"input": "x"}, {})[0]
    answer = chat_answer("hi")
    answer["choices"][0]["logprobs"] = {
        "content": [
            {"token": "h", "bytes": [104], "logprob": -0.5, "top_logprobs": []},
            {"token": "i", "bytes": [105], "logprob": -0.25, "top_logprobs": []},
        ]
    }
    part = from_chat(answer, {"input": "x"})["output"][0]["content"][0]
    assert [(lp["token"], lp["logprob"]) for lp in part["logprobs"]] == [("h", -0.5), ("i", -0.25)]
