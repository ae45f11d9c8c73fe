"""RemoteInferenceEngine against three real embedded servers (``python -m servers.launch_server``):
load spreading, stickiness, a server killed mid-run, and generations cut by weight updates
(disk, and distributed with this test as the trainer's rank 0).

The tests share one pool and run in file order: the update tests move the servers' weights
last.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from arealite.api.config.rollout import GenerationHyperparameters, InferenceEngineConfig
from arealite.api.io_struct import ModelRequest, ParamSpec, WeightUpdateMeta
from arealite.rollout.remote_engine import RemoteInferenceEngine
from arealite.utils.network import LOOPBACK, find_free_port, find_free_ports, wait_http_ok
from tests.support.procs import kill_group, log_tail

pytestmark = pytest.mark.integration

N_SERVERS = 3


class ServerProcs:
    """N embedded servers on fixed ports, each in its own process group (restartable)."""

    def __init__(self, model_path: Path, n: int):
        self.model_path = model_path
        self.ports = find_free_ports(n)
        self.addrs = [f"{LOOPBACK}:{p}" for p in self.ports]
        self.procs: list[subprocess.Popen | None] = [None] * n
        self.version, self.state = 0, None  # the pool's weights (None: the model dir's own)
        self.logs = [tempfile.NamedTemporaryFile("w+", suffix=f".srv{i}.log", delete=False) for i in range(n)]

    def start(self, i: int) -> None:
        cmd = [sys.executable, "-m", "servers.launch_server", "--model-path", str(self.model_path),
               "--host", LOOPBACK, "--port", str(self.ports[i]), "--weight-version", "0",
               "--log-level", "warning"]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.procs[i] = subprocess.Popen(cmd, stdout=self.logs[i], stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True)

    def wait(self, i: int, timeout: float = 120) -> None:
        p = self.procs[i]
        if not wait_http_ok(f"http://{self.addrs[i]}/health", timeout, alive=lambda: p.poll() is None):
            raise RuntimeError(f"server {i} did not start:\n{log_tail(self.logs[i].name)}")

    def kill(self, i: int) -> None:
        kill_group(self.procs[i], grace=0.1)

    def close(self) -> None:
        for p in self.procs:
            if p is not None:
                kill_group(p)
        for f in self.logs:
            f.close()


@pytest.fixture(scope="module")
def pool(tiny_model_dir):
    procs = ServerProcs(tiny_model_dir, N_SERVERS)
    try:
        for i in range(N_SERVERS):
            procs.start(i)
        for i in range(N_SERVERS):
            procs.wait(i)
        yield procs
    finally:
        procs.close()


def make_engine(addrs, **kw) -> RemoteInferenceEngine:
    cfg = InferenceEngineConfig(setup_timeout=30, request_timeout=120, weight_update_timeout=60, **kw)
    eng = RemoteInferenceEngine(cfg)
    eng.initialize(addrs)
    return eng


def start_all(eng: RemoteInferenceEngine, reqs: list[ModelRequest], group: int = 0):
    """Run the requests concurrently on the engine's loop; returns a concurrent future. The
    last ``group`` of them go as one group (``agenerate_group``: one batched call)."""

    async def go():
        k = len(reqs) - group
        singles, grouped = await asyncio.gather(
            asyncio.gather(*(eng.agenerate(r) for r in reqs[:k])),
            eng.agenerate_group(reqs[k:]) if group else asyncio.sleep(0, []))
        return [*singles, *grouped]

    return eng.executor.run_coroutine(go())


def run_all(eng: RemoteInferenceEngine, reqs: list[ModelRequest], timeout: float = 120):
    return start_all(eng, reqs).result(timeout)


def request(rid: str, n: int, prompt=(5, 6, 7, 8), **g) -> ModelRequest:
    return ModelRequest(rid=rid, input_ids=list(prompt),
                        gconfig=GenerationHyperparameters(max_new_tokens=n, ignore_eos=True, **g))


def test_round_robin_spreads_requests_evenly(pool):
    eng = make_engine(pool.addrs, sticky_rids=False)
    try:
        out = run_all(eng, [request(f"rr{i}", 8) for i in range(12)])
        assert Counter(r.server for r in out) == {a: 4 for a in pool.addrs}
        assert all(r.output_len == 8 and r.output_versions == [0] * 8 for r in out)
        assert all(len(r.output_logprobs) == 8 and max(r.output_logprobs) <= 0 for r in out)
    finally:
        eng.destroy()


def test_rid_sticky_turns_land_on_one_server(pool):
    eng = make_engine(pool.addrs, sticky_rids=True, schedule_policy="least_inflight")
    try:
        history: dict[str, list[int]] = {f"conv{i}": [3, 4, 5 + i] for i in range(3)}
        servers: dict[str, set[str]] = {rid: set() for rid in history}
        for _turn in range(3):
            out = run_all(eng, [request(rid, 4, prompt=ids) for rid, ids in history.items()])
            for (rid, ids), r in zip(list(history.items()), out):
                servers[rid].add(r.server)
                history[rid] = ids + r.output_tokens + [7]  # next turn: the whole conversation
        assert all(len(s) == 1 for s in servers.values()), servers
        assert len({next(iter(s)) for s in servers.values()}) == 3  # and spread over the pool
    finally:
        eng.destroy()


def test_killed_server_loses_no_request_and_is_readmitted(pool, caplog):
    eng = make_engine(pool.addrs, sticky_rids=False, unhealthy_after_failures=1,
                      health_check_interval=0.5, request_retries=3)
    dead = pool.addrs[1]
    try:
        n = 400
        reqs = [request(f"kill{i}", n) for i in range(12)]
        with caplog.at_level("WARNING", logger="arealite.rollout.remote_engine"):
            fut = start_all(eng, reqs)
            deadline = time.monotonic() + 10
            while eng.pool.servers[dead].inflight < 4 and time.monotonic() < deadline:
                time.sleep(0.005)
            time.sleep(0.05)
            pool.kill(1)  # SIGKILL mid-generation
            out = fut.result(120)
        retried = [m for m in caplog.messages if f"failed on {dead}" in m]
        assert retried, "no request was in flight on the killed server"
        assert all(r.output_len == n and len(r.output_versions) == n for r in out)  # none lost
        assert sum(r.server == dead for r in out) + len(retried) == 4
        assert pool.addrs[1] in eng.pool.unhealthy_addrs()
        pool.start(1)  # restarted on the same port, launch version 0 = current
        pool.wait(1)
        deadline = time.monotonic() + 20
        while pool.addrs[1] in eng.pool.unhealthy_addrs() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert eng.pool.healthy_addrs() == pool.addrs
        out = run_all(eng, [request(f"back{i}", 4) for i in range(6)])
        assert Counter(r.server for r in out)[pool.addrs[1]] == 2
    finally:
        eng.destroy()


# --------------------------------------------------------------------------- weight updates


def perturbed_state(model_dir: Path, seed: int, scale: float = 0.05) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    return {k: v + scale * torch.randn(v.shape, generator=gen) for k, v in model.state_dict().items()}


def save_model(model_dir: Path, state: dict[str, torch.Tensor], out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.load_state_dict(state)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out)


def reference_logprobs(model_dir: Path, state, prompt: list[int], output: list[int]) -> torch.Tensor:
    """log_softmax(logits) of each output token under ``state`` (temperature 1)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if state is not None:
        model.load_state_dict(state)
    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(output)[:, None])[:, 0]


def check_versions_match_weights(model_dir, states: dict[int, dict | None], prompt, r) -> int:
    """Every token's logprob must come from the weights its version names; returns the index
    of the first token of the newest version."""
    refs = {v: reference_logprobs(model_dir, s, prompt, r.output_tokens) for v, s in states.items()}
    got = torch.tensor(r.output_logprobs)
    versions = torch.tensor(r.output_versions)
    for v, ref in refs.items():
        mine = versions == v
        assert torch.allclose(got[mine], ref[mine], atol=2e-3), f"version {v} tokens do not match"
        for w, other in refs.items():  # and the other weights really do differ there
            if w != v and mine.any():
                assert (got[mine] - other[mine]).abs().max() > 1e-2
    return int((versions == max(states)).nonzero()[0]) if (versions == max(states)).any() else len(versions)


@pytest.mark.parametrize("mode", ["abort", "retract", "in_place"])
def test_generation_cut_by_disk_update_switches_version_at_the_cut(pool, tiny_model_dir, tmp_path, mode):
    """abort: the client resumes the cut requests; retract / in_place: the server keeps them
    and reports the switch in ``weight_versions`` spans. Each run moves the pool one version
    up (``pool.version``, ``pool.state``)."""
    old_v, old_state = pool.version, pool.state
    new_v, new = old_v + 1, perturbed_state(tiny_model_dir, seed=10 + old_v)
    eng = make_engine(pool.addrs, sticky_rids=True, pause_mode=mode)
    eng.set_version(old_v)
    try:
        meta = WeightUpdateMeta(type="disk", version=new_v, path=str(tmp_path / "new"))
        save_model(tiny_model_dir, new, tmp_path / "new")
        meta.write_disk_marker()  # what the trainer does once the files are complete
        n = 480  # long enough (prompt + n < 512 positions) for the pause to land mid-way
        # the last three: a group of one prompt in one batched call (prefilled once), whose
        # samples a pause cuts and the client resumes one by one
        reqs = [request(f"cut-{mode}-{i}", n, prompt=[5, 6, 7 + min(i, 3)]) for i in range(6)]
        fut = start_all(eng, reqs, group=3)
        time.sleep(0.1)
        eng.update_weights(meta).result(60)  # pause -> load -> continue, mid-generation
        out = fut.result(120)
        pool.version, pool.state = new_v, new
        assert eng.get_version() == new_v
        cut = 0
        for q, r in zip(reqs, out):
            assert r.output_len == n and len(r.output_logprobs) == n  # as many as requested
            v = r.output_versions
            k = v.index(new_v) if new_v in v else n
            assert v == [old_v] * k + [new_v] * (n - k)  # one switch, nothing lost or doubled
            if 0 < k < n:
                cut += 1
                if mode != "in_place":  # in_place decodes on the old KV cache: no exact reference
                    states = {old_v: old_state, new_v: new}
                    assert check_versions_match_weights(tiny_model_dir, states, q.input_ids, r) == k
        assert cut >= 1, [r.output_versions.count(new_v) for r in out]
        after = run_all(eng, [request("after", 5)])[0]
        assert after.output_versions == [new_v] * 5
        greedy = [request(f"g{i}", 6, prompt=[9, 8, 7], greedy=True) for i in range(4)]
        alone, together = run_all(eng, greedy[:1])[0], start_all(eng, greedy[1:], 3).result(60)
        for r in together:  # a group in one call: what one request alone gets
            assert r.output_tokens == alone.output_tokens and r.output_versions == [new_v] * 6
            assert max(abs(a - b) for a, b in zip(r.output_logprobs, alone.output_logprobs)) < 1e-5
    finally:
        eng.destroy()


def test_distributed_update_with_test_as_rank0(pool, tiny_model_dir):
    import torch.distributed as dist

    from arealite.utils.distributed import destroy_custom_process_group, init_custom_process_group

    eng = make_engine(pool.addrs)
    pg = None
    try:
        state = perturbed_state(tiny_model_dir, seed=2)
        names = sorted(state)
        buckets = [names[: len(names) // 2], names[len(names) // 2 :]]
        specs = [[ParamSpec(k, tuple(state[k].shape), "float32") for k in b] for b in buckets]
        version = pool.version + 1
        eng.set_version(pool.version)
        meta = WeightUpdateMeta(type="distributed", version=version, master_port=find_free_port(),
                                param_specs=specs, timeout=60)
        fut = eng.update_weights(meta)
        deadline = time.monotonic() + 30
        while meta.world_size is None and time.monotonic() < deadline and not fut.done():
            time.sleep(0.01)
        assert meta.world_size == 1 + N_SERVERS and meta.backend == "gloo"
        pg = init_custom_process_group(
            backend=meta.backend, init_method=f"tcp://{meta.master_address}:{meta.master_port}",
            world_size=meta.world_size, rank=0, group_name=meta.group_name, timeout=60,
        )
        for bucket in buckets:
            flat = torch.cat([state[k].contiguous().view(-1).view(torch.uint8) for k in bucket])
            dist.broadcast(flat, src=0, group=pg)
        fut.result(60)
        pool.version, pool.state = version, state
        assert eng.get_version() == version
        eng.verify_weights({k: state[k] for k in names[:3] + ["lm_head.weight"]})
        with pytest.raises(Exception, match="differ"):
            eng.verify_weights({names[0]: state[names[0]] + 1.0})
        r = run_all(eng, [request("dist", 6)])[0]
        assert r.output_versions == [version] * 6
        check_versions_match_weights(tiny_model_dir, {version: state}, [5, 6, 7, 8], r)
    finally:
        eng.destroy()
        destroy_custom_process_group(pg)
