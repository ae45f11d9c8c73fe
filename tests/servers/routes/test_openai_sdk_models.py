"""Every ``/v1`` response body of the embedded server, streamed or not, validates strictly
against the official ``openai`` SDK's own models (``tests.support.sdk_models``): required fields,
exact types, and no undeclared key besides SGLang's documented extensions."""

from __future__ import annotations

import pytest
import requests

from tests.support.sdk_models import sse_events, validate
from tests.support.tool_model import CONVERSATION, TOOLS

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.integration

# SGLang's additions to OpenAI's bodies, each also in SGLang's own responses
SGLANG = ("matched_stop", "metadata", "reasoning_content", "root", "parent", "max_model_len")


def post(server: str, path: str, body: dict) -> requests.Response:
    r = requests.post(f"http://{server}{path}", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r


def test_models_routes(tool_server, tool_model_dir):
    from openai.types import Model

    listed = requests.get(f"http://{tool_server}/v1/models", timeout=30).json()
    assert listed["object"] == "list" and listed["data"]
    for card in listed["data"]:
        validate(Model, card, SGLANG)
    one = requests.get(f"http://{tool_server}/v1/models/{tool_model_dir}", timeout=30).json()
    validate(Model, one, SGLANG)


def test_chat_completions_plain_tools_and_stream(tool_server):
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    plain = {"messages": [{"role": "user", "content": "1+2?"}], "max_tokens": 4,
             "logprobs": True, "top_logprobs": 2, "n": 2, "temperature": 1.0}
    validate(ChatCompletion, post(tool_server, "/v1/chat/completions", plain).json(), SGLANG)
    tools = {"messages": CONVERSATION[:1], "tools": TOOLS, "max_tokens": 120, "temperature": 0}
    body = post(tool_server, "/v1/chat/completions", tools).json()
    assert body["choices"][0]["message"]["tool_calls"]  # the taught model calls the tool
    validate(ChatCompletion, body, SGLANG)
    for req in (plain, tools):
        chunks = sse_events(post(tool_server, "/v1/chat/completions",
                                 {**req, "stream": True,
                                  "stream_options": {"include_usage": True}}).text)
        assert chunks and chunks[-1]["usage"]
        for c in chunks:
            validate(ChatCompletionChunk, c, SGLANG)


def first_token_unscored(body: dict) -> dict:
    """An echoed prompt's first token has no logprob: OpenAI's legacy API and SGLang send
    null (and null top logprobs) there, which the SDK's CompletionChoice lists (floats, dicts)
    cannot hold. That one null is checked and dropped; the rest validates strictly."""
    for ch in body["choices"]:
        lp = ch.get("logprobs")
        if lp and lp["token_logprobs"] and lp["token_logprobs"][0] is None:
            assert lp["text_offset"][0] == -1
            for k in ("tokens", "token_logprobs", "text_offset"):
                lp[k] = lp[k][1:]
            if lp["top_logprobs"]:  # none at all with logprobs 0
                assert lp["top_logprobs"][0] is None
                lp["top_logprobs"] = lp["top_logprobs"][1:]
    return body


def test_completions_plain_echo_scoring_and_stream(tool_server):
    from openai.types import Completion

    reqs = [{"prompt": "1+2", "max_tokens": 4, "n": 2, "temperature": 1.0},
            {"prompt": [5, 9, 13], "max_tokens": 2, "echo": True, "logprobs": 2},
            {"prompt": [5, 9, 13], "max_tokens": 0, "echo": True, "logprobs": 0}]
    for req in reqs:
        body = post(tool_server, "/v1/completions", req).json()
        validate(Completion, first_token_unscored(body), SGLANG)
        chunks = sse_events(post(tool_server, "/v1/completions",
                                 {**req, "stream": True,
                                  "stream_options": {"include_usage": True}}).text)
        assert chunks
        for c in chunks:
            # OpenAI's own stream sends finish_reason null before the last chunk; the SDK
            # reads chunks into Completion unvalidated, whose finish_reason has no null:
            # a null is checked as null, the rest of the chunk strictly
            for ch in c["choices"]:
                if ch["finish_reason"] is None:
                    ch["finish_reason"] = "length"
            validate(Completion, first_token_unscored(c), SGLANG)
