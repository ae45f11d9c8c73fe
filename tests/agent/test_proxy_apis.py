"""The proxy's Responses (``/v1/responses``) and Anthropic Messages (``/v1/messages``) routes,
driven by the official ``openai`` and ``anthropic`` SDKs and the Agents SDK's default
``OpenAIResponsesModel``: tool-call round trips, streamed and not, record the same trajectory
(token ids, loss mask, logprobs, versions) as the chat route for the same conversation."""

from __future__ import annotations

import json

import pytest

from arealite.api.config.rollout import GenerationHyperparameters, InferenceEngineConfig
from arealite.rollout.remote_engine import RemoteInferenceEngine
from tests.support.tool_model import CONVERSATION, TOOLS

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
pytestmark = pytest.mark.integration

GREEDY = GenerationHyperparameters(max_new_tokens=120, greedy=True, temperature=0.0)
QUESTION = CONVERSATION[0]["content"]
FN = TOOLS[0]["function"]
RESPONSES_TOOLS = [{"type": "function", **FN}]
ANTHROPIC_TOOLS = [
    {"name": FN["name"], "description": FN["description"], "input_schema": FN["parameters"]}
]


@pytest.fixture(scope="module")
def engine(tool_server):
    eng = RemoteInferenceEngine(InferenceEngineConfig(setup_timeout=30, request_timeout=120))
    eng.initialize([tool_server])
    eng.set_version(0)
    yield eng
    eng.destroy()


@pytest.fixture(scope="module")
def proxy(engine, tool_model_dir):
    from transformers import AutoTokenizer

    from arealite.agent.proxy import AgentProxy

    return AgentProxy(engine, AutoTokenizer.from_pretrained(str(tool_model_dir)), GREEDY)


def run(engine, coro, timeout: float = 180):
    return engine.executor.run_coroutine(coro).result(timeout)


async def chat_agent(client) -> list[str]:
    msgs, seen = [{"role": "user", "content": QUESTION}], []
    for _ in range(4):
        m = (
            (await client.chat.completions.create(model="p", messages=msgs, tools=TOOLS))
            .choices[0]
            .message
        )
        msgs.append(m.model_dump(exclude_none=True))
        if not m.tool_calls:
            return seen + [m.content]
        for c in m.tool_calls:
            seen.append(json.loads(c.function.arguments)["expr"])
            msgs.append({"role": "tool", "tool_call_id": c.id, "content": str(eval(seen[-1]))})
    return seen


async def responses_agent(client, stream: bool) -> list[str]:
    """Full input history when not streamed; ``previous_response_id`` when streamed."""
    items: list = [{"role": "user", "content": QUESTION}]
    seen, prev = [], None
    for _ in range(4):
        kw = dict(model="p", tools=RESPONSES_TOOLS, max_output_tokens=120)
        if stream:
            async with client.responses.stream(input=items, previous_response_id=prev, **kw) as s:
                kinds = [e.type async for e in s]
                r = await s.get_final_response()
            assert kinds[:2] == ["response.created", "response.in_progress"]
            assert kinds[-1] == "response.completed"
            prev, items = r.id, []
        else:
            r = await client.responses.create(input=items, **kw)
            items += [o.model_dump(exclude_none=True) for o in r.output]
        calls = [o for o in r.output if o.type == "function_call"]
        if not calls:
            return seen + [r.output_text]
        for c in calls:
            seen.append(json.loads(c.arguments)["expr"])
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": c.call_id,
                    "output": str(eval(seen[-1])),
                }
            )
    return seen


async def messages_agent(client, stream: bool) -> list[str]:
    msgs: list = [{"role": "user", "content": QUESTION}]
    seen = []
    for _ in range(4):
        kw = dict(model="p", max_tokens=120, tools=ANTHROPIC_TOOLS, messages=msgs)
        if stream:
            async with client.messages.stream(**kw) as s:
                kinds = [e.type async for e in s]
                m = await s.get_final_message()
            assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
        else:
            m = await client.messages.create(**kw)
        msgs.append(
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]}
        )
        uses = [b for b in m.content if b.type == "tool_use"]
        if not uses:
            assert m.stop_reason == "end_turn"
            return seen + ["".join(b.text for b in m.content if b.type == "text")]
        assert m.stop_reason == "tool_use"
        results = []
        for b in uses:
            seen.append(b.input["expr"])
            results.append(
                {"type": "tool_result", "tool_use_id": b.id, "content": str(eval(seen[-1]))}
            )
        msgs.append({"role": "user", "content": results})
    return seen


def test_each_api_records_the_chat_routes_trajectory(engine, proxy):
    sessions = {
        k: proxy.start_session()
        for k in ("chat", "responses", "responses-stream", "messages", "messages-stream")
    }
    assert run(engine, chat_agent(proxy.client(sessions["chat"]))) == ["12*7", "84+5", "89"]
    assert run(engine, responses_agent(proxy.client(sessions["responses"]), False)) == [
        "12*7",
        "84+5",
        "89",
    ]
    assert run(engine, responses_agent(proxy.client(sessions["responses-stream"]), True)) == [
        "12*7",
        "84+5",
        "89",
    ]
    assert run(engine, messages_agent(proxy.anthropic_client(sessions["messages"]), False)) == [
        "12*7",
        "84+5",
        "89",
    ]
    assert run(
        engine, messages_agent(proxy.anthropic_client(sessions["messages-stream"]), True)
    ) == ["12*7", "84+5", "89"]
    ref = sessions.pop("chat")
    [want] = ref.rows()
    assert want["num_turns"] == 3 and 0 < sum(want["loss_mask"]) < len(want["loss_mask"])
    for name, s in sessions.items():
        [row] = s.rows()  # one segment: each turn extended the last, nothing re-tokenized
        for key in ("input_ids", "loss_mask", "versions", "num_turns"):
            assert row[key] == want[key], (name, key)
        assert row["logprobs"] == pytest.approx(want["logprobs"], abs=1e-4), name
        assert [t.completion_ids for t in s.turns] == [t.completion_ids for t in ref.turns]


def test_the_agents_sdk_default_responses_model_through_the_proxy(engine, proxy):
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    calls: list[str] = []

    @agents.function_tool
    def calc(expr: str) -> str:
        """Evaluate an arithmetic expression."""
        calls.append(expr)
        return str(eval(expr, {"__builtins__": {}}))

    plain, streamed = proxy.start_session(), proxy.start_session()

    def agent(session):
        model = agents.OpenAIResponsesModel(model="policy", openai_client=proxy.client(session))
        return agents.Agent(name="calculator", tools=[calc], model=model)

    async def main():
        out = (await agents.Runner.run(agent(plain), QUESTION, max_turns=6)).final_output
        result = agents.Runner.run_streamed(agent(streamed), QUESTION, max_turns=6)
        kinds = {e.type async for e in result.stream_events()}
        return out, result.final_output, kinds

    out, out_streamed, kinds = run(engine, main())
    assert out == out_streamed == "89" and calls == ["12*7", "84+5"] * 2
    assert "raw_response_event" in kinds
    for s in (plain, streamed):
        assert len(s.turns) == 3 and len(s.segments) == 1
    [a], [b] = plain.rows(), streamed.rows()
    assert a["input_ids"] == b["input_ids"] and a["loss_mask"] == b["loss_mask"]


def test_bad_input_is_a_4xx_in_each_apis_own_shape(engine, proxy):
    session = proxy.start_session()
    oa, an = proxy.client(session), proxy.anthropic_client(session)

    async def main():
        errors = []
        for call in (
            oa.responses.create(
                model="p",
                input=[
                    {
                        "role": "user",
                        "content": [{"type": "input_image", "image_url": "http://x/y.png"}],
                    }
                ],
            ),
            oa.responses.create(model="p", input="hi", previous_response_id="resp_nope"),
            oa.responses.create(model="p", input="hi", tools=[{"type": "web_search"}]),
            an.messages.create(
                model="p", max_tokens=0, messages=[{"role": "user", "content": "hi"}]
            ),
            an.messages.create(
                model="p",
                max_tokens=8,
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}
                        ],
                    }
                ],
            ),
        ):
            try:
                await call
            except (openai.APIStatusError, anthropic.APIStatusError) as e:
                errors.append(e)
        return errors

    errors = run(engine, main())
    assert [e.status_code for e in errors] == [400, 404, 400, 400, 400]
    assert "input_image" in errors[0].message and "resp_nope" in errors[1].message
    assert "web_search" in errors[2].message
    for e in errors[3:]:
        assert e.body["type"] == "error" and e.body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in errors[3].message and "'image'" in errors[4].message
    assert not session.turns  # nothing was generated or recorded


def test_count_tokens_is_the_rendered_prompt(engine, proxy, tool_model_dir):
    session = proxy.start_session()
    n = run(
        engine,
        proxy.anthropic_client(session).messages.count_tokens(
            model="p", messages=[{"role": "user", "content": QUESTION}], tools=ANTHROPIC_TOOLS
        ),
    )
    tok = proxy.tokenizer
    text = tok.apply_chat_template(
        CONVERSATION[:1], tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert n.input_tokens == len(tok.encode(text, add_special_tokens=False))


def test_forced_formats_through_the_proxy(engine, proxy, tool_model_dir):
    """``output_type=`` (a json_schema format) and forced tool calls become grammars the
    server enforces: unforced, this model answers "Think: 2+3?" in free text."""
    from pydantic import BaseModel, Field

    from arealite.agent.proxy import AgentProxy

    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)

    class Verdict(BaseModel):
        n: int = Field(ge=0, le=99)
        ok: bool

    # the tool server runs with --constrained-json-disable-any-whitespace: the same for calls
    strict = AgentProxy(engine, proxy.tokenizer, GREEDY, json_any_whitespace=False)
    calls: list[str] = []

    @agents.function_tool
    def calc(expr: str) -> str:
        """Evaluate an arithmetic expression."""
        calls.append(expr)
        return "tool-ran"

    sessions = [strict.start_session() for _ in range(4)]

    async def main():
        settings = agents.ModelSettings(max_tokens=80)
        typed = []
        for s, kind in zip(sessions, ("OpenAIResponsesModel", "OpenAIChatCompletionsModel")):
            model = getattr(agents, kind)(model="policy", openai_client=strict.client(s))
            agent = agents.Agent(
                name="typed", output_type=Verdict, model=model, model_settings=settings
            )
            typed.append((await agents.Runner.run(agent, "Is 2+2 four?", max_turns=1)).final_output)
        forced = agents.Agent(
            name="forced",
            tools=[calc],
            tool_use_behavior="stop_on_first_tool",
            model=agents.OpenAIResponsesModel(model="p", openai_client=strict.client(sessions[2])),
            model_settings=agents.ModelSettings(max_tokens=120, tool_choice="required"),
        )
        out = (await agents.Runner.run(forced, "Think: 2+3?", max_turns=2)).final_output
        msg = await strict.anthropic_client(sessions[3]).messages.create(
            model="p",
            max_tokens=120,
            tools=ANTHROPIC_TOOLS,
            tool_choice={"type": "tool", "name": "calc"},
            messages=[{"role": "user", "content": "Think: 2+3?"}],
        )
        return typed, out, msg

    typed, out, msg = run(engine, main())
    assert all(isinstance(v, Verdict) for v in typed)
    assert out == "tool-ran" and len(calls) == 1
    assert msg.stop_reason == "tool_use" and [b.type for b in msg.content] == ["tool_use"]
    assert isinstance(msg.content[0].input.get("expr"), str)
    # what the sessions recorded is what was enforced: each completion decodes to the format
    tok = proxy.tokenizer
    for s in sessions[:2]:
        Verdict.model_validate_json(tok.decode(s.turns[0].completion_ids, skip_special_tokens=True))
    for s in sessions[2:]:
        text = tok.decode(s.turns[0].completion_ids, skip_special_tokens=True)
        assert text.startswith('<tool_call>\n{"name": "calc", "arguments": {"expr": ')
        assert s.turns[0].finish_reason == "tool_calls"
