"""Tool calls through the proxy with a real model's chat template: SmolLM2-135M-Instruct's
template concatenates ``message['content']`` and so cannot render an assistant turn whose
content is None (every tool-call reply). A forcing ``tool_choice`` makes the real model call the
tool (the servers' grammar); each API then sends its history back with that turn, and the proxy
must render it as SGLang's chat route does (content ``""``). Few, short generations: slow on CPU.
"""

from __future__ import annotations

import json

import pytest
import requests

from arealite.api.config.rollout import GenerationHyperparameters, InferenceEngineConfig
from arealite.rollout.remote_engine import RemoteInferenceEngine

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
pytestmark = [pytest.mark.slow, pytest.mark.integration]

# a forced call is ~50 of its (small) tokens
GREEDY = GenerationHyperparameters(max_new_tokens=64, greedy=True, temperature=0.0)
QUESTION = "What is the weather in Paris?"
FN = {
    "name": "get_weather",
    "description": "the current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "London"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
TOOLS = [{"type": "function", "function": FN}]
RESPONSES_TOOLS = [{"type": "function", **FN}]
ANTHROPIC_TOOLS = [
    {"name": FN["name"], "description": FN["description"], "input_schema": FN["parameters"]}
]
ANSWER_TOKENS = 6  # the reply after the tool result: only that it is served matters


@pytest.fixture(scope="module")
def server(smollm2_dir):
    from tests.support.procs import embedded_server

    args = ["--context-length", "1024", "--tool-call-parser", "qwen25", "--random-seed", "0",
            "--constrained-json-disable-any-whitespace", "--weight-version", "0"]
    with embedded_server(str(smollm2_dir), args, timeout=300) as addr:
        yield addr


@pytest.fixture(scope="module")
def engine(server):
    eng = RemoteInferenceEngine(InferenceEngineConfig(setup_timeout=60, request_timeout=300))
    eng.initialize([server])
    eng.set_version(0)
    yield eng
    eng.destroy()


@pytest.fixture(scope="module")
def proxy(engine, smollm2_dir):
    from transformers import AutoTokenizer

    from arealite.agent.proxy import AgentProxy

    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    return AgentProxy(engine, tok, GREEDY, json_any_whitespace=False)


def run(engine, coro, timeout: float = 600):
    return engine.executor.run_coroutine(coro).result(timeout)


def one_segment_two_turns(session) -> None:
    """Both calls recorded; the second extends the first's tokens (the real tool call the model
    generated stays in the row, it is never re-rendered away)."""
    assert len(session.turns) == 2 and len(session.segments) == 1
    [row] = session.rows()
    first, second = session.turns
    assert first.completion_ids and second.completion_ids
    assert second.prompt_ids[: len(first.prompt_ids) + len(first.completion_ids)] == (
        first.prompt_ids + first.completion_ids
    )
    assert row["input_ids"] == second.prompt_ids + second.completion_ids


def test_the_smollm2_template_cannot_render_a_none_content(proxy):
    """The premise: rendered as the agent sends it, the template fails."""
    conv = [{"role": "user", "content": QUESTION},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c", "type": "function",
                 "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}]
    import jinja2

    with pytest.raises(jinja2.exceptions.UndefinedError, match="has no attribute 'content'"):
        proxy.tokenizer.apply_chat_template(conv, tokenize=False)


def test_chat_tool_round_trip(engine, proxy):
    session = proxy.start_session()

    async def main():
        client = proxy.client(session)
        msgs: list = [{"role": "user", "content": QUESTION}]
        r = await client.chat.completions.create(
            model="p", messages=msgs, tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "get_weather"}})
        m = r.choices[0].message
        assert m.content is None and r.choices[0].finish_reason == "tool_calls"
        [call] = m.tool_calls
        msgs.append(m.model_dump(exclude_none=True) | {"content": None})
        msgs.append({"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"})
        r2 = await client.chat.completions.create(
            model="p", messages=msgs, tools=TOOLS, max_tokens=ANSWER_TOKENS)
        return json.loads(call.function.arguments), r2.choices[0].message

    args, answer = run(engine, main())
    assert args["city"] in ("Paris", "London") and not answer.tool_calls
    one_segment_two_turns(session)


def test_responses_tool_round_trip(engine, proxy):
    session = proxy.start_session()

    async def main():
        client = proxy.client(session)
        items: list = [{"role": "user", "content": QUESTION}]
        r = await client.responses.create(model="p", input=items, tools=RESPONSES_TOOLS,
                                          tool_choice="required")
        [call] = [o for o in r.output if o.type == "function_call"]
        items += [o.model_dump(exclude_none=True) for o in r.output]
        items.append({"type": "function_call_output", "call_id": call.call_id,
                      "output": "sunny, 21 C"})
        r2 = await client.responses.create(model="p", input=items, tools=RESPONSES_TOOLS,
                                           max_output_tokens=ANSWER_TOKENS)
        return call, r2

    call, r2 = run(engine, main())
    assert call.name == "get_weather" and r2.status in ("completed", "incomplete")
    one_segment_two_turns(session)


def test_messages_tool_round_trip(engine, proxy):
    session = proxy.start_session()

    async def main():
        client = proxy.anthropic_client(session)
        msgs: list = [{"role": "user", "content": QUESTION}]
        m = await client.messages.create(model="p", max_tokens=64, messages=msgs,
                                         tools=ANTHROPIC_TOOLS, tool_choice={"type": "any"})
        [use] = [b for b in m.content if b.type == "tool_use"]
        msgs.append({"role": "assistant",
                     "content": [b.model_dump(exclude_none=True) for b in m.content]})
        msgs.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": use.id, "content": "sunny, 21 C"}]})
        m2 = await client.messages.create(model="p", max_tokens=ANSWER_TOKENS, messages=msgs,
                                          tools=ANTHROPIC_TOOLS)
        return m, m2

    m, m2 = run(engine, main())
    assert m.stop_reason == "tool_use" and m2.stop_reason in ("end_turn", "max_tokens")
    one_segment_two_turns(session)


def test_agents_sdk_tool_round_trip(engine, proxy):
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    cities: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """the current weather in a city"""
        cities.append(city)
        return "sunny, 21 C"

    session = proxy.start_session()

    async def main():
        model = agents.OpenAIResponsesModel(model="policy", openai_client=proxy.client(session))
        agent = agents.Agent(
            name="weather", tools=[get_weather], model=model,
            # the SDK resets tool_choice to auto after the call, so the second turn answers
            model_settings=agents.ModelSettings(tool_choice="required", max_tokens=64))
        return (await agents.Runner.run(agent, QUESTION, max_turns=2)).final_output

    out = run(engine, main())
    assert cities and cities[0] in ("Paris", "London") and isinstance(out, str)
    one_segment_two_turns(session)


def test_server_chat_route_renders_a_none_content(server):
    """The embedded server's own /v1/chat/completions with the same history (SGLang's "")."""
    msgs = [{"role": "user", "content": QUESTION},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "c", "content": "sunny, 21 C"}]
    r = requests.post(f"http://{server}/v1/chat/completions", timeout=300, json={
        "messages": msgs, "tools": TOOLS, "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200, r.text
    openai.types.chat.ChatCompletion.model_validate(r.json(), strict=True)
