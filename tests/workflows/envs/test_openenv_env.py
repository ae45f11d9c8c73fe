"""OpenEnvWorkflow over a real server (the toy SFT model) and real OpenEnv servers started as local
processes: the project's OpenEnv environment on the toy task (examples/openenv_envs/) and the
echo environment OpenEnv itself ships (``openenv init``'s scaffold, generated here). The rows
are the server's own greedy tokens with their log-probs and version, and the returns equal
what OpenEnv's own client gets from the environment for the same replies.

OpenEnv (``openenv`` 0.10 with ``fastmcp`` 3, which needs ``mcp<2``) is not in the suite's venv
(verifiers needs ``mcp`` 2): the tests that run it skip unless it is importable (docs/environments.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from arealite.api.config.rollout import GenerationHyperparameters, InferenceEngineConfig
from arealite.rollout.remote_engine import RemoteInferenceEngine

NO_OPENENV = ("OpenEnv (openenv 0.10, fastmcp 3, mcp<2) is not installed: it needs an "
              "environment of its own (docs/environments.md)")

ROOT = Path(__file__).resolve().parents[3]
GREEDY = GenerationHyperparameters(max_new_tokens=12, greedy=True, temperature=0.0)
PROXY = "arealite.agent.proxy:AgentProxy"
N_TASKS = 6


@pytest.fixture(scope="module")
def openenv_installed():
    pytest.importorskip("openenv.core", reason=NO_OPENENV)


@pytest.fixture(scope="module")
def engine(openenv_installed, toy_assets):  # skipped before the toy assets are built
    from tests.support.procs import embedded_server

    with embedded_server(str(toy_assets / "sft_model"),
                         ["--random-seed", "0", "--weight-version", "0"]) as addr:
        eng = RemoteInferenceEngine(InferenceEngineConfig(setup_timeout=30, request_timeout=120))
        eng.initialize([addr])
        eng.set_version(0)
        yield eng, addr
        eng.destroy()


def workflow(toy_assets, **kw):
    from transformers import AutoTokenizer

    from workflows.envs.openenv_env import OpenEnvWorkflow

    return OpenEnvWorkflow(GREEDY, AutoTokenizer.from_pretrained(str(toy_assets / "sft_model")),
                           proxy=PROXY, **kw)


def run(eng, coro, timeout: float = 600):
    return eng.executor.run_coroutine(coro).result(timeout)


def completions(traj, tokenizer) -> list[tuple[list[int], list[list[int]]]]:
    """(prompt ids, [generated ids of each turn]) of each row."""
    out = []
    for i in range(traj["input_ids"].shape[0]):
        n = int(traj["attention_mask"][i].sum())
        ids, mask = traj["input_ids"][i, :n].tolist(), traj["loss_mask"][i, :n].tolist()
        runs, cur = [], []
        for t, m in zip(ids, mask):
            if m:
                cur.append(t)
            elif cur:
                runs.append(cur)
                cur = []
        runs.append(cur)
        out.append((ids[:mask.index(1)], runs))
    return out


async def openenv_rewards(url: str, reset: dict, replies: list[str]) -> float:
    """What OpenEnv's own client gets for these replies: the sum of the step rewards."""
    from openenv import GenericEnvClient

    total = 0.0
    async with GenericEnvClient(base_url=url) as env:
        await env.reset(**reset)
        for text in replies:
            result = await env.step({"message": text})
            total += result.reward or 0.0
            if result.done:
                break
    return total


@pytest.mark.integration
def test_toy_math_environment_rows_and_returns(engine, toy_assets):
    eng, addr = engine
    data = toy_assets / "toy_math" / "valid.jsonl"
    wf = workflow(toy_assets, app="toy_math_env:app", app_paths=[str(ROOT / "examples" / "openenv_envs")],
                  app_env={"TOY_MATH_PATH": str(data)}, observation_field="question", n_episodes=2)
    try:
        got = []
        for k in range(N_TASKS):
            traj = run(eng, wf.arun_episode(eng, {"reset": {"index": k}}))
            assert traj["input_ids"].shape[0] == 2 and traj["num_turns"].tolist() == [1, 1]
            lm, v = traj["loss_mask"].bool(), traj["versions"]
            assert ((v >= 0) == lm).all() and (v[lm] == 0).all() and traj["logprobs"][lm].lt(0).any()
            (prompt, (out,)), _ = completions(traj, wf.tokenizer)
            # the completion is the server's own greedy continuation of the prompt
            res = requests.post(f"http://{addr}/generate", timeout=120, json={
                "input_ids": prompt, "sampling_params": {"max_new_tokens": 12, "temperature": 0}})
            assert res.json()["output_ids"] == out
            question = json.loads(data.read_text().splitlines()[k])["question"]
            assert question in wf.tokenizer.decode(prompt)
            text = wf.tokenizer.decode(out, skip_special_tokens=True)
            theirs = run(eng, openenv_rewards(wf.server.url, {"index": k}, [text]))
            assert traj["rewards"].tolist() == [theirs, theirs]
            got.append(theirs)
        assert 0 < sum(got) < N_TASKS, got  # both outcomes occur
    finally:
        run(eng, wf.aclose())
    assert wf.server is None


@pytest.mark.integration
def test_the_echo_environment_openenv_ships(engine, toy_assets, tmp_path):
    """``openenv init``'s echo environment, unchanged: no ``done``, a reward of
    min(0.1 * len(message), 1) a step; two turns make one two-turn row whose return is the sum."""
    eng, _ = engine
    made = subprocess.run([sys.executable, "-m", "openenv.cli", "init", "echo_env", "-o", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr[-2000:]
    wf = workflow(toy_assets, app="echo_env.server.app:app", app_paths=[str(tmp_path)],
                  observation_field="echoed_message", max_turns=2, n_episodes=1)
    try:
        traj = run(eng, wf.arun_episode(eng, {}))
        assert traj["num_turns"].tolist() == [2]
        ((_, outs),) = completions(traj, wf.tokenizer)
        texts = [wf.tokenizer.decode(o, skip_special_tokens=True) for o in outs]
        want = sum(min(len(t) * 0.1, 1.0) for t in texts)
        theirs = run(eng, openenv_rewards(wf.server.url, {}, texts))
        assert traj["rewards"].tolist() == pytest.approx([want]) and theirs == pytest.approx(want)
    finally:
        run(eng, wf.aclose())


def test_bad_configuration_is_refused(tiny_model_dir, tmp_path):
    """Checked before anything starts, OpenEnv installed or not."""
    from transformers import AutoTokenizer

    from workflows.envs.openenv_env import OpenEnvWorkflow, main, observation_text

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    for kw in ({"base_url": "http://127.0.0.1:1", "app": "x:app"}, {}):
        with pytest.raises(ValueError, match="exactly one of base_url"):
            OpenEnvWorkflow(GREEDY, tok, proxy=PROXY, **kw)
    with pytest.raises(ValueError, match="max_turns"):
        OpenEnvWorkflow(GREEDY, tok, proxy=PROXY, base_url="http://127.0.0.1:1", max_turns=0)
    with pytest.raises(ValueError, match="n_samples=1"):
        OpenEnvWorkflow(GREEDY.new(n_samples=2), tok, proxy=PROXY, base_url="http://127.0.0.1:1")
    with pytest.raises(ValueError, match="no text field 'text'"):
        observation_text({"question": "q"}, "text")
    assert observation_text({"b": 1, "a": "x"}, None) == '{"a": "x", "b": 1}'
    assert main(["rows", "0", str(tmp_path / "r.jsonl")]) == 2
    assert main(["rows", "3", str(tmp_path / "r.jsonl")]) == 0
    assert [json.loads(x) for x in (tmp_path / "r.jsonl").read_text().splitlines()] == [
        {"reset": {"index": k}} for k in range(3)]
