"""The official ``openai`` client against the embedded server's ``/v1`` routes."""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.support.http_calls import gen, post
from tests.support.tool_model import CONVERSATION, TOOLS

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def client(tool_server):
    return openai.OpenAI(base_url=f"http://{tool_server}/v1", api_key="unused", max_retries=0,
                         timeout=60)


def test_models_lists_the_served_model(client, tool_model_dir):
    models = client.models.list().data
    assert [m.id for m in models] == [str(tool_model_dir)]


def test_chat_logprobs_n_usage_and_seed(client):
    msgs = [{"role": "user", "content": "1+2?"}]
    r = client.chat.completions.create(model="m", messages=msgs, max_tokens=6, n=3,
                                       logprobs=True, top_logprobs=2, seed=7, temperature=1.0)
    assert len(r.choices) == 3 and [c.index for c in r.choices] == [0, 1, 2]
    for c in r.choices:
        lp = c.logprobs.content
        assert 1 <= len(lp) <= 6
        assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in lp)
        assert c.finish_reason in ("stop", "length")
    assert r.usage.completion_tokens == sum(len(c.logprobs.content) for c in r.choices)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    again = client.chat.completions.create(model="m", messages=msgs, max_tokens=6, seed=7,
                                           temperature=1.0, max_completion_tokens=6)
    assert again.choices[0].message.content == r.choices[0].message.content  # seeded


def test_completions_text_tokens_and_stream(client):
    r = client.completions.create(model="m", prompt=["1+2", "3+4"], max_tokens=4, logprobs=1,
                                  temperature=0)
    assert len(r.choices) == 2
    assert all(len(c.logprobs.tokens) == len(c.logprobs.token_logprobs) for c in r.choices)
    ids = client.completions.create(model="m", prompt=[5, 6, 7], max_tokens=3, temperature=0)
    assert ids.usage.prompt_tokens == 3
    chunks = list(client.completions.create(model="m", prompt="1+2", max_tokens=4,
                                            temperature=0, stream=True))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    whole = client.completions.create(model="m", prompt="1+2", max_tokens=4, temperature=0)
    assert text == whole.choices[0].text


def test_tool_calls_over_three_turns_with_tool_results(client):
    msgs = [CONVERSATION[0]]
    seen = []
    for _ in range(3):
        r = client.chat.completions.create(model="m", messages=msgs, tools=TOOLS,
                                           max_tokens=120, temperature=0)
        m = r.choices[0].message
        msgs.append(m.model_dump(exclude_none=True))
        if not m.tool_calls:
            assert r.choices[0].finish_reason == "stop"
            seen.append(m.content)
            break
        assert r.choices[0].finish_reason == "tool_calls" and m.content is None
        call = m.tool_calls[0]
        assert call.id.startswith("call_") and call.function.name == "calc"
        expr = json.loads(call.function.arguments)["expr"]
        seen.append(expr)
        msgs.append({"role": "tool", "tool_call_id": call.id, "content": str(eval(expr))})
    assert seen == ["12*7", "84+5", "89"]
    # without tools the same text stays content (no parser runs)
    plain = client.chat.completions.create(model="m", messages=[CONVERSATION[0]],
                                           max_tokens=120, temperature=0)
    assert plain.choices[0].message.tool_calls is None


def test_streamed_tool_call_equals_the_non_streamed_one(client):
    kw = dict(model="m", messages=[CONVERSATION[0]], tools=TOOLS, max_tokens=120, temperature=0)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [(c.function.name, c.function.arguments) for c in calls] == [("calc", '{"expr": "12*7"}')]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ""
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage.completion_tokens > 0 and chunks[-1].choices == []


@pytest.mark.parametrize("kwargs, fragment", [
    ({"messages": []}, "messages must be a non-empty list"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "'role' must be one of"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": -1}, "temperature"),
    ({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3}, "top_logprobs needs logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tools[0]"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 100000}, "context length"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "calc", "arguments": "{bad"}}]}]},
     "not valid JSON"),
])
def test_errors_come_back_in_openai_shape(client, kwargs, fragment):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", **kwargs)
    assert e.value.status_code == 400 and fragment in e.value.message
    assert e.value.body["object"] == "error" and e.value.body["code"] == 400
    # the server still serves the next request
    ok = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                        max_tokens=2)
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_stop_strings_trim_the_text_streamed_or_not(client):
    kw = dict(model="m", messages=[CONVERSATION[0]], tools=TOOLS, max_tokens=120,
              temperature=0, stop=["calc"])
    r = client.chat.completions.create(**kw)
    c = r.choices[0]
    assert c.finish_reason == "stop" and c.matched_stop == "calc"
    assert c.message.content == '<tool_call>\n{"name": "' and c.message.tool_calls is None
    chunks = list(client.chat.completions.create(stream=True, **kw))
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == ""
    # without tools (another prompt, other text): a stop string cut out of the stream too. The
    # stop string is taken from what the model says, and the model is made to say 8 tokens
    # whatever it learnt (ignore_eos; special tokens kept as text), so there is text to cut.
    plain = dict(kw, tools=None, stop=None, max_tokens=8,
                 extra_body={"ignore_eos": True, "skip_special_tokens": False})
    text = client.chat.completions.create(**plain).choices[0].message.content
    assert len(text) >= 3
    plain["stop"] = [text[1:3]]
    whole = client.chat.completions.create(**plain).choices[0].message.content
    streamed = "".join(ch.choices[0].delta.content or "" for ch in
                       client.chat.completions.create(stream=True, **plain) if ch.choices)
    assert streamed == whole and text.startswith(whole) and len(whole) <= 1


def test_echo_with_logprobs_scores_the_prompt_as_generate_does(client, tool_server):
    """lm-eval's loglikelihood: echo + logprobs, prompt log-probs first (the first None)."""
    prompt = [5, 9, 13, 21, 8]
    r = client.completions.create(model="m", prompt=prompt, max_tokens=1, echo=True,
                                  logprobs=1, temperature=0)
    lp = r.choices[0].logprobs
    ref = gen(f"http://{tool_server}", {"input_ids": prompt, "return_logprob": True,
                                        "logprob_start_len": 0, "top_logprobs_num": 1,
                                        "sampling_params": {"max_new_tokens": 1,
                                                            "temperature": 0}})["meta_info"]
    want = [v for v, _, _ in ref["input_token_logprobs"] + ref["output_token_logprobs"]]
    assert len(lp.token_logprobs) == len(prompt) + 1 and lp.token_logprobs[0] is None
    assert lp.token_logprobs[1:] == pytest.approx(want[1:], abs=1e-5)
    assert lp.top_logprobs[0] is None and len(lp.top_logprobs) == len(prompt) + 1
    # greedy continuation: the chosen token is its row's best
    assert max(lp.top_logprobs[-1].values()) == pytest.approx(lp.token_logprobs[-1], abs=1e-6)
    streamed = [c.choices[0] for c in client.completions.create(
        model="m", prompt=prompt, max_tokens=1, echo=True, logprobs=1, temperature=0,
        stream=True) if c.choices and c.choices[0].logprobs]
    assert streamed[0].logprobs.token_logprobs[:len(prompt)] == lp.token_logprobs[:len(prompt)]


def test_prompt_scoring_with_max_tokens_0(client, tool_server):
    """echo + ``max_tokens: 0``: the prompt's log-probs and nothing generated (OpenAI's legacy
    API and SGLang accept it; ``logprobs: 0`` asks for the chosen tokens' values only)."""
    prompt = [5, 9, 13, 21, 8]
    ref = gen(f"http://{tool_server}", {"input_ids": prompt, "return_logprob": True,
                                        "logprob_start_len": 0,
                                        "sampling_params": {"max_new_tokens": 0}})["meta_info"]
    want = [v for v, _, _ in ref["input_token_logprobs"]]
    for logprobs in (0, 1):
        r = client.completions.create(model="m", prompt=prompt, max_tokens=0, echo=True,
                                      logprobs=logprobs)
        c = r.choices[0]
        assert r.usage.completion_tokens == 0 and c.finish_reason == "length"
        assert c.text == client.completions.create(model="m", prompt=prompt, max_tokens=1,
                                                   echo=True).choices[0].text[:len(c.text)]
        assert c.logprobs.token_logprobs[0] is None and len(c.logprobs.token_logprobs) == 5
        assert c.logprobs.token_logprobs[1:] == pytest.approx(want[1:], abs=1e-5)
        streamed = [ch.choices[0] for ch in client.completions.create(
            model="m", prompt=prompt, max_tokens=0, echo=True, logprobs=logprobs, stream=True)
            if ch.choices]
        assert "".join(ch.text for ch in streamed) == c.text
        assert [x for ch in streamed if ch.logprobs for x in ch.logprobs.token_logprobs] == (
            c.logprobs.token_logprobs)
    with pytest.raises(openai.BadRequestError, match="max_tokens must be in"):
        client.completions.create(model="m", prompt=prompt, max_tokens=-1)


def test_completions_stop_at_16_tokens_by_default(client):
    r = client.completions.create(model="m", prompt="1+2", temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 16 and r.choices[0].finish_reason == "length"


def test_seed_with_n_gives_different_reproducible_choices(client):
    kw = dict(model="m", prompt="hello", max_tokens=8, temperature=1.5, seed=11,
              extra_body={"ignore_eos": True})
    a = [c.text for c in client.completions.create(n=4, **kw).choices]
    b = [c.text for c in client.completions.create(n=4, **kw).choices]
    assert a == b and len(set(a)) > 1
    assert client.completions.create(n=1, **kw).choices[0].text == a[0]


def test_chat_stream_opens_with_the_first_token(client, tool_server):
    """No chunk goes out before the engine has a token: held by a pause, nothing arrives."""
    base = f"http://{tool_server}"
    got: list[tuple[float, dict]] = []

    def read() -> None:
        for c in client.chat.completions.create(
                model="m", messages=[CONVERSATION[0]], max_tokens=3, stream=True):
            got.append((time.monotonic(), c.model_dump()))

    assert post(base, "/pause_generation", {"mode": "in_place"}).status_code == 200
    try:
        t = threading.Thread(target=read, daemon=True)
        t.start()
        time.sleep(3.0)
        resumed = time.monotonic()
    finally:
        assert post(base, "/continue_generation", {}).status_code == 200
    t.join(timeout=60)
    assert got and got[0][0] >= resumed
    assert got[0][1]["choices"][0]["delta"]["role"] == "assistant"


def test_retrieve_model(client, tool_model_dir):
    card = client.models.retrieve(str(tool_model_dir))
    assert card.id == str(tool_model_dir) and card.object == "model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")
