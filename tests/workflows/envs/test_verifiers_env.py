"""VerifiersWorkflow over a real server (the toy SFT model): a verifiers environment written in
the project (examples/verifiers_envs/vf_toy_math.py) runs unchanged (its harness program in a
subprocess runtime, its calls through verifiers' interception server and arealite's proxy),
the rows are the tokens the server generated, and the rewards equal the scores verifiers' own
eval entry point (``run_eval``, what ``vf-eval`` runs) gives the same completions."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import requests

from arealite.api.config.rollout import GenerationHyperparameters, InferenceEngineConfig
from arealite.rollout.remote_engine import RemoteInferenceEngine
from tests.support.verifiers_eval import verifiers_own_eval

pytest.importorskip("verifiers.v1")
pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
GREEDY = GenerationHyperparameters(max_new_tokens=24, greedy=True, temperature=0.0)
PROXY = "arealite.agent.proxy:AgentProxy"
N_TASKS = 6


def toy_env(path: Path) -> dict:
    return {"taskset": {"id": "vf_toy_math", "path": str(path)},
            "agent": {"harness": {"id": "arealite_locked_chat"},
                      "runtime": {"type": "subprocess"}}}


@pytest.fixture(scope="module")
def setup(toy_assets, tmp_path_factory):
    from tests.support.procs import embedded_server
    from workflows.envs.verifiers_env import export_tasks

    tmp = tmp_path_factory.mktemp("vf")
    env = toy_env(toy_assets / "toy_math" / "valid.jsonl")
    n = export_tasks(env, tmp / "tasks.jsonl", limit=N_TASKS,
                     env_paths=[str(ROOT / "examples" / "verifiers_envs")])
    assert n == N_TASKS
    model = toy_assets / "sft_model"
    with embedded_server(str(model), ["--random-seed", "0", "--weight-version", "0"]) as addr:
        eng = RemoteInferenceEngine(InferenceEngineConfig(setup_timeout=30, request_timeout=120))
        eng.initialize([addr])
        eng.set_version(0)
        yield eng, addr, env, model, tmp
        eng.destroy()


def workflow(setup, **kw):
    from transformers import AutoTokenizer

    from workflows.envs.verifiers_env import VerifiersWorkflow

    eng, _, env, model, _ = setup
    kw.setdefault("env", env)
    return VerifiersWorkflow(GREEDY, AutoTokenizer.from_pretrained(str(model)), proxy=PROXY,
                             env_paths=[str(ROOT / "examples" / "verifiers_envs")], **kw)


def run(eng, coro, timeout: float = 600):
    return eng.executor.run_coroutine(coro).result(timeout)


def test_rows_are_the_servers_tokens_and_the_traces_rewards(setup):
    eng, addr, _, _, tmp = setup
    wf = workflow(setup, n_episodes=2, metrics=["has_answer"])
    rows = [json.loads(x) for x in (tmp / "tasks.jsonl").read_text().splitlines()][:2]
    try:
        for row in rows:
            traj = run(eng, wf.arun_episode(eng, row))
            assert traj["input_ids"].shape[0] == 2 and traj["num_turns"].tolist() == [1, 1]
            for i in range(2):
                n = int(traj["attention_mask"][i].sum())
                ids = traj["input_ids"][i, :n].tolist()
                mask = traj["loss_mask"][i, :n].tolist()
                start = mask.index(1)
                assert all(mask[start:]) and not any(mask[:start])
                # the completion is the server's own greedy continuation of the prompt
                out = requests.post(f"http://{addr}/generate", timeout=120, json={
                    "input_ids": ids[:start],
                    "sampling_params": {"max_new_tokens": 24, "temperature": 0}}).json()
                assert out["output_ids"] == ids[start:]
                assert traj["versions"][i, start:n].eq(0).all()
                assert traj["logprobs"][i, start:n].lt(0).any()
                text = wf.tokenizer.decode(ids[start:], skip_special_tokens=True)
                gold = row["answer"].split("####")[1].strip()
                want = float(text.strip().startswith("####")
                             and text.split("####")[1].split()[0] == gold)
                assert float(traj["rewards"][i]) == want
            assert traj["metric/has_answer"].tolist() == [1.0, 1.0]
    finally:
        run(eng, wf.aclose())


def test_rewards_equal_verifiers_own_eval_on_the_same_completions(setup):
    """Greedy generation: the eval entry point, its client at a proxy session, produces the
    same completions; each task's reward arealite trains on equals the eval's score."""
    eng, _, env, _, tmp = setup
    wf = workflow(setup, n_episodes=1)
    rows = [json.loads(x) for x in (tmp / "tasks.jsonl").read_text().splitlines()]

    async def ours():
        out = {}
        for row in rows:
            ep, session = await wf.episode(eng, wf.task(row))
            (trace,) = ep.traces
            out[row["idx"]] = (trace.last_reply, session.reward)
        return out

    async def theirs():
        episodes = await verifiers_own_eval(wf, eng, env, N_TASKS, 2, tmp / "vf_eval")
        return {ep.task.data.idx: (ep.traces[0].last_reply, ep.traces[0].reward)
                for ep in episodes}

    try:
        a = run(eng, ours())
        b = run(eng, theirs())
    finally:
        run(eng, wf.aclose())
    assert sorted(a) == sorted(b) == list(range(N_TASKS))
    assert [a[i][0] for i in sorted(a)] == [b[i][0] for i in sorted(b)]  # same completions
    assert [a[i][1] for i in sorted(a)] == [b[i][1] for i in sorted(b)]  # same rewards
    assert 0 < sum(r for _, r in a.values()) < N_TASKS, a  # both outcomes occur


def test_multi_turn_environment_is_one_segment_of_two_turns(setup):
    """vf_toy_math_dialog: a scripted user asks a second question after the first reply; the
    session records both turns in one token sequence (the second prompt extends the first turn's
    tokens), and the reward is the environment's partial credit over both replies."""
    eng, _, env, _, tmp = setup
    dialog = {"taskset": {**env["taskset"], "id": "vf_toy_math_dialog"},
              "assistant": env["agent"]}
    from workflows.envs.verifiers_env import export_tasks

    wf = workflow(setup, env=dialog, n_episodes=1)

    export_tasks(dialog, tmp / "dialog.jsonl", limit=1,
                 env_paths=[str(ROOT / "examples" / "verifiers_envs")])
    row = json.loads((tmp / "dialog.jsonl").read_text().splitlines()[0])
    try:
        ep, session = run(eng, wf.episode(eng, wf.task(row)))
    finally:
        run(eng, wf.aclose())
    (trace,) = ep.traces
    assert len(session.turns) == 2 and len(session.segments) == 1
    first, second = session.turns
    assert second.prompt_ids[:len(first.prompt_ids) + len(first.completion_ids)] == (
        first.prompt_ids + first.completion_ids)
    assert "What is" in wf.tokenizer.decode(second.prompt_ids[len(first.prompt_ids):])
    replies = [m.content or "" for m in trace.assistant_messages]
    assert replies == [wf.tokenizer.decode(t.completion_ids, skip_special_tokens=True).strip()
                       for t in session.turns]
    def number(text):
        m = re.search(r"####\s*(-?\d+)", text)
        return m.group(1) if m else None

    want = sum(number(r) is not None and number(r) == number(a)
               for r, a in zip(replies, row["answers"])) / 2
    assert session.reward == trace.reward == want
