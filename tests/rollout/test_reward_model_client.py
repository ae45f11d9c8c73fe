"""The reward-model client against a pool of real embedded reward-model servers
(``--is-embedding``, with an api key): its scores equal a transformers forward to 1e-5; a
wrong key fails at start-up; a server that dies costs retries on the other, never a score; a
sequence the servers refuse is a 400 for that sequence only; the gateway (``servers.gateway``)
over the pool is one address for the client, round-robin, past a dead worker, passing a server's
400 through; and RLVR episodes combine the pool's scores with the rule reward, each sample scored
as soon as it is generated."""

from __future__ import annotations

import asyncio
import random
import sys

import pytest
import requests
import torch

from arealite.api.config.rollout import GenerationHyperparameters, InferenceEngineConfig
from arealite.rollout.remote_engine import GenerationError
from arealite.rollout.reward_model_client import RemoteRewardModelEngine
from arealite.utils.network import find_free_port, wait_http_ok
from tests.support.procs import embedded_servers, kill_group, log_tail, spawn
from workflows.rewards.format import FormatReward
from workflows.rewards.model import combine_rewards
from workflows.rewards.toy import toy_reward
from workflows.rlvr import RLVRWorkflow

pytestmark = pytest.mark.integration
KEY = "rm-test-key"


@pytest.fixture(scope="module")
def rm_pool(tiny_reward_model_dir):
    with embedded_servers(str(tiny_reward_model_dir), 2,
                          ["--is-embedding", "--api-key", KEY, "--context-length", "128"]) as s:
        yield s


@pytest.fixture(scope="module")
def hf_rm(tiny_reward_model_dir):
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(
        str(tiny_reward_model_dir), dtype=torch.float32).eval()


def _score(hf, ids) -> float:
    with torch.no_grad():
        return float(hf(input_ids=torch.tensor([list(ids)])).logits[0, 0])


def _client(addrs, key=KEY, **kw) -> RemoteRewardModelEngine:
    cfg = InferenceEngineConfig(server_addrs=addrs, api_key=key, setup_timeout=30,
                                request_timeout=30, health_check_interval=0.5,
                                unhealthy_after_failures=1, **kw)
    eng = RemoteRewardModelEngine(cfg)
    eng.initialize()
    return eng


def _seqs(hf, n, seed):
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        s = [rng.randrange(3, hf.config.vocab_size) for _ in range(rng.randint(2, 30))]
        if s[-1] != hf.config.pad_token_id:  # HF pools the last non-pad token
            out.append(s)
    return out


def _score_forwards(addr: str) -> int:
    info = requests.get(f"http://{addr}/server_info", timeout=5,
                        headers={"Authorization": f"Bearer {KEY}"}).json()
    return info["internal_states"][0].get("score_forwards", 0)  # none before the first score


def test_the_gateway_routes_scoring_to_the_pool(rm_pool, hf_rm):
    addrs = [a for a, _ in rm_pool]
    port, dead = find_free_port(), find_free_port()  # nothing listens on `dead`
    cmd = [sys.executable, "-m", "servers.gateway", "--servers", ",".join([*addrs, f"127.0.0.1:{dead}"]),
           "--port", str(port), "--api-key", KEY, "--health-check-interval", "30"]
    with spawn(cmd) as (gw, log):
        assert wait_http_ok(f"http://127.0.0.1:{port}/health", 60), log_tail(log)
        before = [_score_forwards(a) for a in addrs]
        eng = _client([f"127.0.0.1:{port}"])  # the gateway is the pool's one address
        try:
            seqs = _seqs(hf_rm, 12, 2)
            got = asyncio.run(eng.ascore_batch(seqs))
            assert max(abs(g - _score(hf_rm, s)) for g, s in zip(got, seqs)) < 1e-5
        finally:
            eng.destroy()
        assert all(_score_forwards(a) > b for a, b in zip(addrs, before))  # both servers scored
        url, auth = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {KEY}"}
        workers = requests.get(f"{url}/workers", headers=auth, timeout=5).json()["workers"]
        assert [w["is_healthy"] for w in workers] == [True, True, False]  # the dead one, found
        enc = requests.post(f"{url}/encode", json={"input_ids": [seqs[0], seqs[1]]}, headers=auth,
                            timeout=30)
        assert enc.status_code == 200
        assert [e["embedding"][0] for e in enc.json()] == pytest.approx(got[:2], abs=1e-5)
        bad = requests.post(f"{url}/classify", json={"input_ids": []}, headers=auth, timeout=30)
        assert bad.status_code == 400 and "empty" in bad.text  # the server's own answer
        assert requests.post(f"{url}/classify", json={"input_ids": [3]},
                             timeout=30).status_code == 401  # the gateway's key check


def test_scores_failover_and_a_bad_sequence(rm_pool, hf_rm):
    addrs = [a for a, _ in rm_pool]
    with pytest.raises(Exception, match="api"):
        _client(addrs, key="wrong")
    eng = _client(addrs)
    try:
        seqs = _seqs(hf_rm, 12, 0)
        got = asyncio.run(eng.ascore_batch(seqs))
        assert max(abs(g - _score(hf_rm, s)) for g, s in zip(got, seqs)) < 1e-5
        # one sequence longer than the servers' context: a 400 for it, the others are scored
        outs = asyncio.run(_gather_each(eng, seqs[:3] + [list(range(3, 200))]))
        assert isinstance(outs[3], GenerationError) and outs[3].status == 400
        assert "context length" in str(outs[3])
        assert max(abs(o[0] - g) for o, g in zip(outs[:3], got[:3])) < 1e-6
        # a server dies: its requests are retried on the other; every score arrives
        kill_group(rm_pool[0][1])
        seqs = _seqs(hf_rm, 10, 1)
        got = asyncio.run(eng.ascore_batch(seqs))
        assert max(abs(g - _score(hf_rm, s)) for g, s in zip(got, seqs)) < 1e-5
        assert addrs[0] in eng.pool.unhealthy_addrs()
    finally:
        eng.destroy()


async def _gather_each(eng, seqs):
    return await asyncio.gather(*(eng.ascore_batch([s]) for s in seqs), return_exceptions=True)


def test_rlvr_episodes_combine_the_model_score(rm_pool, hf_rm, local_engine, tiny_tokenizer):
    live = [a for a, p in rm_pool if p.poll() is None]  # the previous test killed one
    eng = _client(live)
    g = GenerationHyperparameters(n_samples=4, max_new_tokens=8, temperature=1.0)
    row = {"question": "What is 12 + 34?", "answer": "#### 46"}
    try:
        for mode, rule_fn in (("sum", toy_reward), ("gate", FormatReward("gsm8k"))):
            combine = {"mode": mode, "model_weight": 0.5, "rule_weight": 2.0, "gate_fail": -7.0}
            wf = RLVRWorkflow(rule_fn, g, tiny_tokenizer, reward_model=eng,
                              reward_model_combine=combine, apply_chat_template=False)
            traj = asyncio.run(wf.arun_episode(local_engine, row))
            for i in range(4):
                real = traj["attention_mask"][i].bool()
                ids = traj["input_ids"][i][real].tolist()
                prompt_len = int((traj["loss_mask"][i][real] == 0).sum())
                text = tiny_tokenizer.decode(ids[prompt_len:], skip_special_tokens=True)
                rule = rule_fn("", text, answer=row["answer"])
                want = combine_rewards(rule, _score(hf_rm, ids), **combine)
                assert float(traj["rewards"][i]) == pytest.approx(want, abs=1e-4), (mode, i)
    finally:
        eng.destroy()
