"""Every response body of the agent proxy (chat completions, Responses, Messages, their streams,
count_tokens, models) validates strictly against the official ``openai`` and ``anthropic`` SDKs'
own models (``tests.support.sdk_models``), on a turn that calls a tool and on one that answers."""

from __future__ import annotations

import pytest
import requests

from arealite.api.config.rollout import GenerationHyperparameters, InferenceEngineConfig
from arealite.rollout.remote_engine import RemoteInferenceEngine
from tests.support.sdk_models import sse_events, validate
from tests.support.tool_model import CONVERSATION, TOOLS

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
pytestmark = pytest.mark.integration

GREEDY = GenerationHyperparameters(max_new_tokens=120, greedy=True, temperature=0.0)
FN = TOOLS[0]["function"]
# the proxy's one addition: the weight versions that generated the reply (chat bodies)
EXTENSIONS = ("metadata",)
# OpenAI's Responses API returns ``store`` in its response object; the SDK's Response model
# does not declare it
RESPONSES_EXTRA = ("store",)


@pytest.fixture(scope="module")
def base(tool_server, tool_model_dir):
    from transformers import AutoTokenizer

    from arealite.agent.proxy import AgentProxy

    eng = RemoteInferenceEngine(InferenceEngineConfig(setup_timeout=30, request_timeout=120))
    eng.initialize([tool_server])
    eng.set_version(0)
    proxy = AgentProxy(eng, AutoTokenizer.from_pretrained(str(tool_model_dir)), GREEDY)
    url = eng.executor.run_coroutine(proxy.serve()).result(60)

    def session_url() -> str:
        sid = requests.post(f"{url}/sessions", json={}, timeout=30).json()["session_id"]
        return f"{url}/sessions/{sid}/v1"

    yield session_url
    eng.executor.run_coroutine(proxy.stop()).result(60)
    eng.destroy()


def post(url: str, body: dict) -> requests.Response:
    r = requests.post(url, json=body, timeout=180)
    assert r.status_code == 200, r.text
    return r


def test_chat_completions_and_models(base):
    from openai.types import Model
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    url = base()
    for card in requests.get(f"{url}/models", timeout=30).json()["data"]:
        validate(Model, card)
    call = post(f"{url}/chat/completions",
                {"messages": CONVERSATION[:1], "tools": TOOLS, "logprobs": True}).json()
    assert call["choices"][0]["message"]["tool_calls"]
    validate(ChatCompletion, call, EXTENSIONS)
    answer = post(f"{base()}/chat/completions", {"messages": CONVERSATION[:5], "tools": TOOLS})
    assert answer.json()["choices"][0]["message"]["content"] == "89"
    validate(ChatCompletion, answer.json(), EXTENSIONS)
    for msgs in (CONVERSATION[:1], CONVERSATION[:5]):
        chunks = sse_events(post(f"{base()}/chat/completions", {
            "messages": msgs, "tools": TOOLS, "stream": True,
            "stream_options": {"include_usage": True}}).text)
        assert chunks[-1]["usage"]
        for c in chunks:
            validate(ChatCompletionChunk, c)


def test_responses_and_its_stream(base):
    from openai.types.responses import Response, ResponseStreamEvent

    tools = [{"type": "function", **FN}]
    first = [{"role": "user", "content": CONVERSATION[0]["content"]}]
    call = post(f"{base()}/responses", {"input": first, "tools": tools}).json()
    assert [o["type"] for o in call["output"]] == ["function_call"]
    validate(Response, call, RESPONSES_EXTRA)
    events = sse_events(post(f"{base()}/responses",
                             {"input": first, "tools": tools, "stream": True}).text)
    assert events[-1]["type"] == "response.completed"
    for e in events:
        validate(ResponseStreamEvent, e, RESPONSES_EXTRA)
    out = post(f"{base()}/responses", {"input": first, "instructions": None,
                                       "max_output_tokens": 120}).json()
    validate(Response, out, RESPONSES_EXTRA)


def test_messages_count_tokens_and_stream(base):
    from anthropic.types import Message, MessageTokensCount, RawMessageStreamEvent

    tools = [{"name": FN["name"], "description": FN["description"],
              "input_schema": FN["parameters"]}]
    body = {"max_tokens": 120, "tools": tools, "model": "p",
            "messages": [{"role": "user", "content": CONVERSATION[0]["content"]}]}
    url = base()
    msg = post(f"{url}/messages", body).json()
    assert msg["stop_reason"] == "tool_use"
    validate(Message, msg)
    validate(MessageTokensCount, post(f"{url}/messages/count_tokens", body).json())
    events = sse_events(post(f"{base()}/messages", {**body, "stream": True}).text)
    assert events[0]["type"] == "message_start" and events[-1]["type"] == "message_stop"
    for e in events:
        validate(RawMessageStreamEvent, e)
