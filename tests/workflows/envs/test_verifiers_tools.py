"""A verifiers environment whose model calls a tool (examples/verifiers_envs/vf_toy_tools.py:
a ``calc`` MCP ``Toolset`` shared by the taskset), run unchanged by VerifiersWorkflow on the
taught tiny tool model (tests/support/tool_model.py replays "What is 12*7+5?" as two ``calc``
calls and the answer). The episode's tool calls are the model's own text parsed into calls
(and the server's ``--tool-call-parser qwen25`` chat route parses the same calls from the
same conversation), the tool ran over MCP and its results came back into the prompt, the
trajectory is the server's greedy tokens turn by turn, and the rewards equal verifiers' own
eval entry point's on the same completions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

from arealite.api.config.rollout import GenerationHyperparameters, InferenceEngineConfig
from arealite.rollout.remote_engine import RemoteInferenceEngine
from tests.support.verifiers_eval import verifiers_own_eval

pytest.importorskip("verifiers.v1")
pytestmark = [pytest.mark.integration, pytest.mark.long]  # a minute or more: 9 episodes

ROOT = Path(__file__).resolve().parents[3]
ENVS = str(ROOT / "examples" / "verifiers_envs")
GREEDY = GenerationHyperparameters(max_new_tokens=120, greedy=True, temperature=0.0)
PROXY = "arealite.agent.proxy:AgentProxy"
# the taught conversation's question with its right answer, and the same question with a gold
# answer the replayed conversation does not reach (the reward's 0 branch)
ROWS = [{"id": "right", "question": "What is 12*7+5?", "answer": "89"},
        {"id": "wrong", "question": "What is 12*7+5?", "answer": "90"}]


@pytest.fixture(scope="module")
def setup(tool_server, tool_model_dir, tmp_path_factory):
    from transformers import AutoTokenizer

    from workflows.envs.verifiers_env import VerifiersWorkflow, export_tasks

    tmp = tmp_path_factory.mktemp("vf_tools")
    (tmp / "toy_tools.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    env = {"taskset": {"id": "vf_toy_tools", "path": str(tmp / "toy_tools.jsonl")},
           "agent": {"harness": {"id": "arealite_locked_chat"},
                     "runtime": {"type": "subprocess"}}}
    assert export_tasks(env, tmp / "tasks.jsonl", env_paths=[ENVS]) == len(ROWS)
    tasks = [json.loads(x) for x in (tmp / "tasks.jsonl").read_text().splitlines()]
    eng = RemoteInferenceEngine(InferenceEngineConfig(setup_timeout=30, request_timeout=120))
    eng.initialize([tool_server])
    eng.set_version(0)
    wf = VerifiersWorkflow(GREEDY, AutoTokenizer.from_pretrained(str(tool_model_dir)),
                           proxy=PROXY, env=env, env_paths=[ENVS], n_episodes=2,
                           metrics=["used_tool"])
    try:
        yield eng, tool_server, wf, env, tasks, tmp
    finally:
        run(eng, wf.aclose())
        eng.destroy()


def run(eng, coro, timeout: float = 600):
    return eng.executor.run_coroutine(coro).result(timeout)


def test_episode_calls_the_tool_and_its_trajectory_is_the_servers_tokens(setup):
    eng, addr, wf, _, tasks, _ = setup
    ep, session = run(eng, wf.episode(eng, wf.task(tasks[0])))
    (trace,) = ep.traces
    calls = [c for m in trace.assistant_messages for c in m.tool_calls or []]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("calc", {"expr": "12*7"}), ("calc", {"expr": "84+5"})]
    assert [m.content for m in trace.tool_messages] == ["84", "89"]  # the tool ran over MCP
    assert trace.last_reply == "89" and trace.reward == session.reward == 1.0
    assert trace.metrics["used_tool"] == 1.0

    # three turns in one token sequence: each prompt extends the last turn's prompt and
    # completion by the tool's result, and each completion is the server's own greedy
    # continuation of its prompt, token for token
    assert len(session.turns) == 3 and len(session.segments) == 1
    for k, turn in enumerate(session.turns):
        out = requests.post(f"http://{addr}/generate", timeout=120, json={
            "input_ids": turn.prompt_ids,
            "sampling_params": {"max_new_tokens": 120, "temperature": 0}}).json()
        assert out["output_ids"] == turn.completion_ids
        if k:
            prev = session.turns[k - 1]
            head = prev.prompt_ids + prev.completion_ids
            assert turn.prompt_ids[:len(head)] == head
            result = trace.tool_messages[k - 1].content
            assert f"<tool_response>\n{result}\n</tool_response>" in wf.tokenizer.decode(
                turn.prompt_ids[len(head):])

    # the server's own tool-call parser (its chat route with --tool-call-parser qwen25) reads
    # the same calls from the same conversation
    messages, tools = trace_messages(trace), [{"type": "function", "function": {
        "name": "calc", "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}}}}]
    asked = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    for i, call in zip(asked[:2], calls):
        reply = requests.post(f"http://{addr}/v1/chat/completions", timeout=120, json={
            "model": "m", "messages": messages[:i], "tools": tools, "temperature": 0,
            "max_tokens": 120}).json()["choices"][0]["message"]
        (got,) = reply["tool_calls"]
        assert (got["function"]["name"], json.loads(got["function"]["arguments"])) == (
            call.name, json.loads(call.arguments))


def trace_messages(trace) -> list[dict]:
    """The trace's conversation as chat messages (tool calls with their raw arguments)."""
    out = []
    for m in trace.messages:
        d = {"role": m.role, "content": m.content}
        if m.role == "assistant" and m.tool_calls:
            d["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.name, "arguments": c.arguments}} for c in m.tool_calls]
        if m.role == "tool":
            d["tool_call_id"] = m.tool_call_id
        out.append(d)
    return out


def test_rows_carry_the_environments_reward_and_group(setup):
    eng, _, wf, _, tasks, _ = setup
    traj = run(eng, wf.arun_episode(eng, tasks[0]))  # n_episodes=2: one group of two rows
    assert traj["input_ids"].shape[0] == 2 and traj["num_turns"].tolist() == [3, 3]
    assert traj["rewards"].tolist() == [1.0, 1.0]
    assert traj["group_baseline"].tolist() == [1.0, 1.0]
    assert traj["metric/used_tool"].tolist() == [1.0, 1.0]
    lm, v = traj["loss_mask"].bool(), traj["versions"]
    assert ((v >= 0) == lm).all() and (v[lm] == 0).all()
    assert (traj["logprobs"][~lm] == 0).all() and traj["logprobs"][lm].lt(0).any()


def test_rewards_equal_verifiers_own_eval_on_the_same_completions(setup):
    """verifiers' eval entry point (``run_eval``, what ``vf-eval`` runs), its client at a proxy
    session, makes the same greedy tool-calling conversations and gives the same scores."""
    eng, _, wf, env, tasks, tmp = setup

    async def ours():
        out = {}
        for row in tasks:
            ep, session = await wf.episode(eng, wf.task(row))
            (trace,) = ep.traces
            out[row["idx"]] = (trace.transcript, session.reward)
        return out

    async def theirs():
        episodes = await verifiers_own_eval(wf, eng, env, len(tasks), 1, tmp / "vf_eval")
        return {ep.task.data.idx: (ep.traces[0].transcript, ep.traces[0].reward)
                for ep in episodes}

    a, b = run(eng, ours()), run(eng, theirs())
    assert sorted(a) == sorted(b) == list(range(len(tasks)))
    assert [a[i][0] for i in sorted(a)] == [b[i][0] for i in sorted(b)]  # same conversations
    assert "[tool_call calc(" in a[0][0]
    assert [a[i][1] for i in sorted(a)] == [b[i][1] for i in sorted(b)] == [1.0, 0.0]
