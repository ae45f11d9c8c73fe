"""A real agent framework nobody here wrote drives the proxy: the ``openai-agents`` SDK runs a
multi-turn tool-calling agent, and the recorded trajectory is checked token by token."""

from __future__ import annotations

import pytest
import requests

from arealite.api.config.rollout import GenerationHyperparameters, InferenceEngineConfig
from arealite.rollout.remote_engine import RemoteInferenceEngine
from tests.support.tool_model import CONVERSATION, TOOLS

agents = pytest.importorskip("agents")
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def engine(tool_server):
    eng = RemoteInferenceEngine(InferenceEngineConfig(setup_timeout=30, request_timeout=120))
    eng.initialize([tool_server])
    yield eng
    eng.destroy()


def test_openai_agents_runner_through_the_proxy(engine, tool_model_dir, tool_server):
    from transformers import AutoTokenizer

    from arealite.agent.proxy import AgentProxy

    agents.set_tracing_disabled(True)
    calls: list[str] = []

    @agents.function_tool
    def calc(expr: str) -> str:
        """Evaluate an arithmetic expression."""
        calls.append(expr)
        return str(eval(expr, {"__builtins__": {}}))

    tok = AutoTokenizer.from_pretrained(str(tool_model_dir))
    proxy = AgentProxy(
        engine, tok, GenerationHyperparameters(max_new_tokens=120, greedy=True, temperature=0.0)
    )
    session = proxy.start_session()

    async def main():
        model = agents.OpenAIChatCompletionsModel(
            model="policy", openai_client=proxy.client(session)
        )
        agent = agents.Agent(name="calculator", instructions=None, tools=[calc], model=model)
        result = await agents.Runner.run(agent, CONVERSATION[0]["content"], max_turns=6)
        return result.final_output

    final = engine.executor.run_coroutine(main()).result(180)
    assert final == "89" and calls == ["12*7", "84+5"]
    assert len(session.turns) == 3 and len(session.segments) == 1
    seg = session.segments[0]
    # token by token: the segment is the template's rendering of the conversation the SDK
    # held, and every generated token is the server's own greedy continuation
    rendered = tok.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False)
    assert tok.decode(seg.tokens) + "\n" == rendered
    for t in session.turns:
        out = requests.post(
            f"http://{tool_server}/generate",
            json={
                "input_ids": t.prompt_ids,
                "sampling_params": {"max_new_tokens": 120, "temperature": 0},
            },
            timeout=60,
        ).json()
        assert out["output_ids"] == t.completion_ids
        start = len(t.prompt_ids)
        assert seg.tokens[start : start + len(t.completion_ids)] == t.completion_ids
        assert seg.loss_mask[start : start + len(t.completion_ids)] == [1] * len(t.completion_ids)
    assert sum(seg.loss_mask) == sum(len(t.completion_ids) for t in session.turns)


def test_agents_sdk_output_type_and_a_forced_tool_call(tool_server):
    """Against the server's own /v1 routes: ``output_type=`` (a strict json_schema
    response_format) and ``tool_choice="required"`` are enforced, not ignored."""
    import asyncio

    import openai
    from pydantic import BaseModel, Field

    agents.set_tracing_disabled(True)

    class Verdict(BaseModel):
        n: int = Field(ge=0, le=99)
        ok: bool

    def model() -> agents.OpenAIChatCompletionsModel:
        client = openai.AsyncOpenAI(
            base_url=f"http://{tool_server}/v1", api_key="unused", max_retries=0, timeout=120
        )
        return agents.OpenAIChatCompletionsModel(model="policy", openai_client=client)

    calls: list[str] = []

    @agents.function_tool
    def calc(expr: str) -> str:
        """Evaluate an arithmetic expression."""
        calls.append(expr)
        return "tool-ran"

    async def main():
        settings = agents.ModelSettings(temperature=0.0, max_tokens=80)
        typed = agents.Agent(
            name="typed", output_type=Verdict, model=model(), model_settings=settings
        )
        verdict = (await agents.Runner.run(typed, "Is 2+2 four?", max_turns=1)).final_output
        forced = agents.Agent(
            name="forced",
            tools=[calc],
            model=model(),
            tool_use_behavior="stop_on_first_tool",
            model_settings=agents.ModelSettings(
                temperature=0.0, max_tokens=120, tool_choice="required"
            ),
        )
        out = (await agents.Runner.run(forced, "Think: 2+3?", max_turns=2)).final_output
        return verdict, out

    verdict, out = asyncio.run(main())
    assert isinstance(verdict, Verdict) and 0 <= verdict.n <= 99
    assert out == "tool-ran" and len(calls) == 1
