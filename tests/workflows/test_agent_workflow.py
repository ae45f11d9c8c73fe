"""AgentWorkflow over a real server: groups of sessions, rewards, and agents that misbehave."""

from __future__ import annotations

import pytest
import torch

from arealite.api.config.rollout import GenerationHyperparameters, InferenceEngineConfig
from arealite.api.workflow_factory import WorkflowImportError
from arealite.rollout.remote_engine import RemoteInferenceEngine
from workflows.agent import AgentError, AgentWorkflow

pytest.importorskip("openai")
pytestmark = pytest.mark.integration
G = GenerationHyperparameters(max_new_tokens=120)
PROXY = "arealite.agent.proxy:AgentProxy"  # the workflow names no default proxy


@pytest.fixture(scope="module")
def engine(tool_server):
    eng = RemoteInferenceEngine(InferenceEngineConfig(setup_timeout=30, request_timeout=120))
    eng.initialize([tool_server])
    yield eng
    eng.destroy()


@pytest.fixture(scope="module")
def tokenizer(tool_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tool_model_dir))


def episode(engine, wf, data=None):
    return engine.executor.run_coroutine(wf.arun_episode(engine, data or {})).result(180)


def test_sessions_form_one_group_with_its_baseline(engine, tokenizer):
    wf = AgentWorkflow(G, tokenizer, proxy=PROXY, agent="tests.support.agents:calculator", n_sessions=4)
    traj = episode(engine, wf, {"answer": "89"})
    assert traj["input_ids"].shape[0] == 4 and traj["session_index"].tolist() == [0, 1, 2, 3]
    r = traj["rewards"]
    assert torch.allclose(traj["group_baseline"], r.mean().expand(4))
    assert torch.allclose(traj["group_scale"], r.std(unbiased=False).expand(4))
    lm, v = traj["loss_mask"], traj["versions"]
    assert ((v >= 0) == lm).all() and lm.any(1).all()  # versions exactly on generated tokens
    assert (traj["logprobs"][~lm] == 0).all()


def test_rewards_set_per_turn_through_the_proxy_route(engine, tokenizer):
    wf = AgentWorkflow(G, tokenizer, proxy=PROXY, agent="tests.support.agents:rewards_each_turn", n_sessions=2,
                       turn_discount=0.5)
    traj = episode(engine, wf)
    # turn rewards 1 then 2: G_0 = 1 + 0.5 * 2
    assert traj["rewards"].tolist() == [2.0, 2.0] and traj["num_turns"].tolist() == [2, 2]


@pytest.mark.parametrize("agent, message", [
    ("raises", "raised KeyError: 'no such tool'"),
    ("returns_garbage", "returned 'great' (str); expected a finite number"),
    ("no_calls", "made no chat call"),
    ("never_ends", "did not finish within 2s"),
])
def test_misbehaving_agents_fail_with_a_clear_error(engine, tokenizer, agent, message):
    wf = AgentWorkflow(G, tokenizer, proxy=PROXY, agent=f"tests.support.agents:{agent}", n_sessions=1,
                       session_timeout=2)
    with pytest.raises(AgentError, match="tests.support.agents:" + agent) as e:
        episode(engine, wf)
    assert message in str(e.value)


def test_bad_configuration_is_caught_at_construction(tokenizer):
    with pytest.raises(WorkflowImportError):
        AgentWorkflow(G, tokenizer, proxy=PROXY, agent="tests.support.agents:missing")
    with pytest.raises(TypeError, match="async def"):
        AgentWorkflow(G, tokenizer, proxy=PROXY, agent="tests.support.agents:not_async")
    with pytest.raises(ValueError, match="n_samples=1"):
        AgentWorkflow(G.new(n_samples=2), tokenizer, proxy=PROXY, agent="tests.support.agents:calculator")
