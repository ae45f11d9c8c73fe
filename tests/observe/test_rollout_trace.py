"""The rollout client's observer hooks (``RolloutObserver``) against scripted servers: which
hooks the client and its executor call, in what order, and the trace events ``RolloutTrace``
makes of them (episodes with their queue wait, requests with their segments and pauses,
retries, reward calls, weight pushes). Unobserved, nothing is called."""

from __future__ import annotations

import threading

import torch

from arealite.api import reward_api
from arealite.api.config.rollout import GenerationHyperparameters
from arealite.api.io_struct import ModelRequest, WeightUpdateMeta
from arealite.api.workflow_api import RolloutWorkflow
from arealite.observe import trace
from arealite.observe.rollout_observer import RolloutObserver
from arealite.observe.rollout_trace import RolloutTrace
from tests.rollout.test_remote_engine import engines, servers  # noqa: F401 - fixtures
from tests.support.scripted_sglang import generate_reply


class Recorder(RolloutObserver):
    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.lock = threading.Lock()

    def _add(self, *call) -> None:
        with self.lock:
            self.calls.append(call)

    def on_episode_submitted(self):
        self._add("submitted")
        return "sub"

    def on_episode_start(self, submitted):
        self._add("episode_start", submitted)
        return "ep"

    def on_episode_end(self, episode, outcome, version):
        self._add("episode_end", episode, outcome, version)

    def on_request_start(self, rid):
        self._add("request_start", rid)
        return rid

    def on_request_attempt(self, request, addr, start, ok):
        self._add("attempt", request, addr, ok)

    def on_request_end(self, request, outcome):
        self._add("request_end", request, outcome)

    def on_weight_update(self, meta, start, end, ok, report):
        self._add("weight_update", meta.version, ok, end >= start)


class OneRequest(RolloutWorkflow):
    """An episode of one request (``rid`` = the row's id), scored by a traced reward call."""

    async def arun_episode(self, engine, data):
        g = GenerationHyperparameters(max_new_tokens=data.get("n", 5))
        resp = await engine.agenerate(ModelRequest(rid=data["id"], input_ids=[1, 2], gconfig=g))
        reward_api.observe_reward_call("fn", 0.0, 0.0, True)
        n = resp.output_len
        return {"input_ids": torch.ones(1, n, dtype=torch.long),
                "attention_mask": torch.ones(1, n, dtype=torch.bool),
                "versions": torch.zeros(1, n, dtype=torch.long), "rewards": torch.tensor([1.0])}


def test_hooks_in_order_and_none_once_detached(servers, engines):  # noqa: F811
    (s,) = servers(1)
    s.on_generate = lambda body, i: (generate_reply(body, n=2, finish={"type": "abort"}) if i == 0
                                     else generate_reply(body))
    eng = engines([s], consumer_batch_size=1, max_head_offpolicyness=10)
    rec = Recorder()
    eng.set_observer(rec)
    assert eng.executor.observer is rec
    eng.submit({"id": "a"}, OneRequest())
    assert eng.wait(1, timeout=20)["input_ids"].shape == (1, 5)
    assert rec.calls == [
        ("submitted",), ("episode_start", "sub"), ("request_start", "a"),
        ("attempt", "a", s.addr, True), ("attempt", "a", s.addr, True),  # cut, then resumed
        ("request_end", "a", "length"), ("episode_end", "ep", "accepted", 0)]
    eng.set_observer(None)
    rec.calls.clear()
    eng.submit({"id": "b"}, OneRequest())
    eng.wait(1, timeout=20)
    assert rec.calls == [] and eng.executor.observer is None


def test_a_failed_request_and_a_group_one_by_one(servers, engines):  # noqa: F811
    (s,) = servers(1)
    eng = engines([s], request_retries=0)
    rec = Recorder()
    eng.set_observer(rec)
    s.on_generate = lambda body, i: (500, {"message": "down"})
    g = GenerationHyperparameters(max_new_tokens=3)
    fut = eng.executor.run_coroutine(eng.agenerate(ModelRequest(rid="x", input_ids=[1], gconfig=g)))
    assert isinstance(fut.exception(20), Exception)
    assert rec.calls == [("request_start", "x"), ("attempt", "x", s.addr, False),
                         ("request_end", "x", "error")]
    s.on_generate = lambda body, i: generate_reply(body)
    rec.calls.clear()
    group = [ModelRequest(rid=f"g{i}", input_ids=[1, 2], gconfig=g) for i in range(3)]
    eng.executor.run_coroutine(eng.agenerate_group(group)).result(20)
    assert sorted(c[1] for c in rec.calls if c[0] == "request_start") == ["g0", "g1", "g2"]


def test_trace_events_of_episodes_requests_rewards_and_pushes(servers, engines, tmp_path):  # noqa: F811
    (s,) = servers(1)
    script = {0: (503, {"message": "busy"}), 2: (503, {"message": "busy"})}  # retried, same server
    s.on_generate = lambda body, i: script.get(i) or (
        generate_reply(body, n=2, finish={"type": "abort"}) if i == 1 else generate_reply(body))
    eng = engines([s], consumer_batch_size=1, unhealthy_after_failures=100)
    tr = trace.start(tmp_path / "t.json")
    try:
        obs = RolloutTrace()
        eng.set_observer(obs)
        reward_api.set_reward_call_observer(obs.on_reward_call)
        eng.submit({"id": "e"}, OneRequest())
        eng.wait(1, timeout=20)
        meta = WeightUpdateMeta(type="disk", version=1, path=str(tmp_path))
        meta.write_disk_marker()
        eng.update_weights(meta).result(10)
    finally:
        eng.set_observer(None)
        reward_api.set_reward_call_observer(None)
        trace.stop()
    by_cat: dict[str, list[dict]] = {}
    for e in trace.load_trace(tr.path):
        if e["ph"] == "X":
            by_cat.setdefault(e["cat"], []).append(e)
    (episode,) = by_cat["episode"]
    ep = episode["args"]["id"]
    assert episode["args"] == {"id": ep, "outcome": "accepted", "version_at_end": 0}
    (queued,) = by_cat["queue"]
    assert queued["name"] == "queued" and queued["args"] == {"episode": ep}
    assert queued["tid"] == episode["tid"] and queued["ts"] == episode["ts"]
    (request,) = by_cat["request"]
    assert request["args"] == {"rid": "e", "episode": ep, "outcome": "length", "segments": 4}
    gens = by_cat["generate"]
    assert [(g["name"], g["args"]["ok"], g["args"]["segment"], g["args"]["resumed"])
            for g in gens] == [(f"generate @ {s.addr}", ok, i, i > 0)
                               for i, ok in enumerate((False, True, False, True))]
    assert all(g["args"]["rid"] == "e" and g["args"]["episode"] == ep for g in gens)
    assert [p["name"] for p in by_cat["pause"]] == ["retry wait", "paused", "retry wait"]
    assert {e["tid"] for e in gens + by_cat["pause"]} == {request["tid"]}
    (reward,) = by_cat["reward"]
    assert reward["name"] == "reward fn" and reward["args"] == {"episode": ep, "ok": True}
    (push,) = by_cat["weight_push"]
    assert push["name"] == "weight push v1" and push["tid"] == trace.WEIGHT_PUSH_TID
    assert push["args"] == {"version": 1, "type": str(meta.type), "ok": True, "servers": [s.addr]}
