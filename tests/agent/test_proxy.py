"""The agent proxy over a real embedded server: exact token ids, masks and per-token versions
over multi-turn tool use, a template that is not append-only, concurrent sessions, and a
session that a weight update interrupts."""

from __future__ import annotations

import asyncio
import json
import re
import shutil

import pytest
import requests

from arealite.api.config.rollout import GenerationHyperparameters, InferenceEngineConfig
from arealite.api.io_struct import WeightUpdateMeta
from arealite.rollout.remote_engine import RemoteInferenceEngine
from tests.support.tool_model import CONVERSATION, THINK_CONVERSATION, TOOLS, think_template

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.integration

GREEDY = GenerationHyperparameters(max_new_tokens=120, greedy=True, temperature=0.0)


@pytest.fixture(scope="module")
def engine(tool_server):
    eng = RemoteInferenceEngine(
        InferenceEngineConfig(setup_timeout=30, request_timeout=120, weight_update_timeout=60)
    )
    eng.initialize([tool_server])
    eng.set_version(0)
    yield eng
    eng.destroy()


@pytest.fixture(scope="module")
def tokenizer(tool_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tool_model_dir))


def run(engine, coro, timeout: float = 180):
    return engine.executor.run_coroutine(coro).result(timeout)


async def calculator_agent(client, question: str = CONVERSATION[0]["content"]) -> list:
    """Ask, run every calc call the model makes, feed the result back; returns the answers."""
    msgs = [{"role": "user", "content": question}]
    seen = []
    for _ in range(4):
        r = await client.chat.completions.create(model="policy", messages=msgs, tools=TOOLS)
        m = r.choices[0].message
        msgs.append(m.model_dump(exclude_none=True))
        if not m.tool_calls:
            seen.append(m.content)
            return seen
        for call in m.tool_calls:
            expr = json.loads(call.function.arguments)["expr"]
            seen.append(expr)
            msgs.append({"role": "tool", "tool_call_id": call.id, "content": str(eval(expr))})
    return seen


def test_three_tool_turns_record_exactly_what_the_server_generated(engine, tokenizer, tool_server):
    from arealite.agent.proxy import AgentProxy

    proxy = AgentProxy(engine, tokenizer, GREEDY, turn_discount=0.5)
    session = proxy.start_session()
    assert run(engine, calculator_agent(proxy.client(session))) == ["12*7", "84+5", "89"]
    session.set_reward(1.0)
    assert len(session.turns) == 3 and len(session.segments) == 1
    seg = session.segments[0]
    # each turn's prompt extends the previous turn's prompt + completion
    for a, b in zip(session.turns, session.turns[1:]):
        assert (
            b.prompt_ids[: len(a.prompt_ids) + len(a.completion_ids)]
            == a.prompt_ids + a.completion_ids
        )
    # the completion ids are the server's: the same prompt, greedy, straight to /generate
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
    # masks, logprobs and versions: 1 / server logprob / version 0 on generated tokens only
    gen = [
        i
        for t in session.turns
        for i in range(len(t.prompt_ids), len(t.prompt_ids) + len(t.completion_ids))
    ]
    assert [i for i, m in enumerate(seg.loss_mask) if m] == gen
    assert all(seg.versions[i] == 0 for i in gen)
    assert all(v == -1 for i, v in enumerate(seg.versions) if i not in set(gen))
    assert [seg.logprobs[i] for i in gen] == [x for t in session.turns for x in t.logprobs]
    assert seg.tokens == session.turns[-1].prompt_ids + session.turns[-1].completion_ids
    # tool results are in the prompt tokens, never trained on
    text = tokenizer.decode(seg.tokens)
    assert (
        "<tool_response>\n84\n</tool_response>" in text
        and "<tool_response>\n89\n</tool_response>" in text
    )
    # rewards: a final reward of 1 discounted over 3 turns
    (row,) = session.rows()
    assert row["rewards"] == pytest.approx(0.25) and row["num_turns"] == 3


def test_a_call_that_fails_after_generation_records_nothing(engine, tokenizer):
    """A template that renders the prompt but rejects the reply the model generated (here: any
    assistant tool call) fails the call with a 400, and the session keeps no segment, no turn."""
    import copy

    from arealite.agent.proxy import AgentProxy

    picky = copy.deepcopy(tokenizer)
    picky.chat_template = (
        "{% for m in messages %}{% if m.tool_calls %}"
        "{{ raise_exception('no tool calls here') }}{% endif %}{% endfor %}"
        + tokenizer.chat_template
    )
    proxy = AgentProxy(engine, picky, GREEDY)
    session = proxy.start_session()
    with pytest.raises(openai.BadRequestError, match="no tool calls here"):
        run(engine, calculator_agent(proxy.client(session)))
    assert session.turns == [] and session.segments == [] and session.rows() == []


def test_template_that_drops_reasoning_starts_a_new_segment(engine, tokenizer):
    from arealite.agent.proxy import AgentProxy

    tok = type(tokenizer).from_pretrained(tokenizer.name_or_path)
    tok.chat_template = think_template()
    proxy = AgentProxy(engine, tok, GREEDY)
    session = proxy.start_session()

    async def agent(client):
        msgs = [THINK_CONVERSATION[0]]
        r = await client.chat.completions.create(model="policy", messages=msgs, tools=TOOLS)
        msgs.append(r.choices[0].message.model_dump(exclude_none=True))
        msgs.append({"role": "user", "content": "And 3+4?"})
        await client.chat.completions.create(
            model="policy", messages=msgs, tools=TOOLS, max_tokens=8
        )
        return r.choices[0].message.content

    assert run(engine, agent(proxy.client(session))) == THINK_CONVERSATION[1]["content"]
    assert [s.turns for s in session.segments] == [[0], [1]]
    first, second = session.segments
    assert "<think>" in tok.decode(first.tokens)
    # the second segment's prompt is the template's own rendering, reasoning dropped
    prompt = session.turns[1].prompt_ids
    assert "<think>" not in tok.decode(prompt) and "5<|im_end|>" in tok.decode(prompt)
    assert first.tokens == session.turns[0].prompt_ids + session.turns[0].completion_ids
    session.set_reward(1.0)
    rows = session.rows()
    assert [r["rewards"] for r in rows] == [1.0, 1.0]  # one session, one reward


def generated_tokens(addr: str) -> float:
    """The server's ``sglang:generation_tokens_total`` (its /metrics)."""
    text = requests.get(f"http://{addr}/metrics", timeout=10).text
    m = re.search(r"^sglang:generation_tokens_total(?:\{[^}]*\})? (\S+)$", text, re.M)
    assert m, text[:2000]
    return float(m.group(1))


def test_concurrent_sessions_across_a_weight_update(
    engine, tokenizer, tool_model_dir, tool_server, tmp_path
):
    """Four sessions: one turn each at version 0, then a weight update, then the rest at
    version 1; a fifth, long turn is cut by the update and keeps per-token versions."""
    from arealite.agent.proxy import AgentProxy

    proxy = AgentProxy(engine, tokenizer, GREEDY)
    sessions = [proxy.start_session() for _ in range(4)]
    clients = [proxy.client(s) for s in sessions]
    first = asyncio.Event()
    go_on = asyncio.Event()

    async def agent(client):
        msgs = [CONVERSATION[0]]
        r = await client.chat.completions.create(model="p", messages=msgs, tools=TOOLS)
        first.set()
        await go_on.wait()
        m = r.choices[0].message
        msgs += [
            m.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "84"},
        ]
        await client.chat.completions.create(model="p", messages=msgs, tools=TOOLS)

    long_proxy = AgentProxy(
        engine, tokenizer, GenerationHyperparameters(max_new_tokens=400, ignore_eos=True)
    )
    long_session = long_proxy.start_session()

    async def long_agent():
        c = long_proxy.client(long_session)
        await c.chat.completions.create(model="p", messages=[{"role": "user", "content": "go"}])

    async def main():
        tasks = [asyncio.create_task(agent(c)) for c in clients]
        await asyncio.wait_for(first.wait(), 120)
        while not all(s.turns for s in sessions):
            await asyncio.sleep(0.05)
        base = await asyncio.to_thread(generated_tokens, tool_server)
        long_task = asyncio.create_task(long_agent())
        # the update comes once the long turn has generated a few of its 400 tokens (polled,
        # not slept: on a quiet machine the whole turn can take less than half a second)
        for _ in range(1200):
            if await asyncio.to_thread(generated_tokens, tool_server) >= base + 4:
                break
            await asyncio.sleep(0.005)
        return tasks, long_task

    new = tmp_path / "v1"
    shutil.copytree(tool_model_dir, new)
    meta = WeightUpdateMeta(type="disk", version=1, path=str(new))
    meta.write_disk_marker()
    tasks, long_task = run(engine, main())
    engine.update_weights(meta).result(120)  # pause -> load -> continue
    engine.set_version(1)

    async def finish():
        go_on.set()
        await asyncio.gather(*tasks, long_task)

    run(engine, finish())
    for s in sessions:
        t0, t1 = s.turns
        assert set(t0.versions) == {0} and set(t1.versions) == {1}
        (seg,) = s.segments
        gen = [v for v, m in zip(seg.versions, seg.loss_mask) if m]
        assert gen == t0.versions + t1.versions
    (t,) = long_session.turns
    assert len(t.completion_ids) == 400 == len(t.versions) == len(t.logprobs)
    k = t.versions.index(1) if 1 in t.versions else 400
    assert t.versions == [0] * k + [1] * (400 - k)
    assert 0 < k < 400, "the update should land inside the long turn"


def test_http_endpoint_for_agents_in_another_process(engine, tokenizer):
    """The same proxy over real HTTP: sessions started, called, rewarded and ended by URL, as
    an agent in another process would; errors in OpenAI's shape."""
    from arealite.agent.proxy import AgentProxy

    proxy = AgentProxy(engine, tokenizer, GREEDY)

    async def main():
        base = await proxy.serve()
        try:
            loop = asyncio.get_running_loop()

            def http_agent() -> tuple:  # blocking code, as a separate program would be
                sid = requests.post(f"{base}/sessions", json={}, timeout=30).json()["session_id"]
                client = openai.OpenAI(
                    base_url=f"{base}/sessions/{sid}/v1", api_key="x", max_retries=0
                )
                answers = []
                msgs = [CONVERSATION[0]]
                for _ in range(3):
                    m = (
                        client.chat.completions.create(model="p", messages=msgs, tools=TOOLS)
                        .choices[0]
                        .message
                    )
                    msgs.append(m.model_dump(exclude_none=True))
                    if not m.tool_calls:
                        answers.append(m.content)
                        break
                    msgs.append(
                        {
                            "role": "tool",
                            "tool_call_id": m.tool_calls[0].id,
                            "content": str(
                                eval(json.loads(m.tool_calls[0].function.arguments)["expr"])
                            ),
                        }
                    )
                ok = requests.post(
                    f"{base}/sessions/{sid}/reward", json={"reward": 1.0}, timeout=30
                )
                bad = requests.post(
                    f"{base}/sessions/{sid}/reward", json={"reward": "x"}, timeout=30
                )
                missing = requests.post(
                    f"{base}/sessions/nope/v1/chat/completions", json={"messages": msgs}, timeout=30
                )
                with pytest.raises(openai.BadRequestError, match="n must be 1"):
                    client.chat.completions.create(model="p", messages=msgs, n=2)
                end = requests.post(f"{base}/sessions/{sid}/end", timeout=30).json()
                return sid, answers, ok.status_code, bad.json(), missing, end

            return await loop.run_in_executor(None, http_agent)
        finally:
            await proxy.stop()

    sid, answers, ok, bad, missing, end = run(engine, main())
    assert answers == ["89"] and ok == 200
    assert bad["object"] == "error" and bad["code"] == 400 and "finite number" in bad["message"]
    assert missing.status_code == 404 and missing.json()["type"] == "NotFoundError"
    assert end == {"ok": True, "turns": 3, "reward": 1.0}
    assert len(proxy.sessions[sid].segments) == 1
