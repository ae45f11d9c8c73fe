"""LoRA weight pushes end to end: the trainer writes only its adapter, the client loads it on the
server as <run>-v<k> beside the older versions with no pause; a request in flight during a push
finishes on the adapter it started with (every token's version and logprob exact, no abort),
new requests get the newest, and versions past the staleness bound are unloaded."""

from __future__ import annotations

import time

import pytest
import requests
import torch

from arealite.api.config.actor import LoRAConfig
from arealite.api.config.rollout import GenerationHyperparameters, InferenceEngineConfig
from arealite.api.io_struct import ModelRequest, SaveLoadMeta, WeightUpdateMeta
from arealite.api.trajectory import pad_sequences_to_tensors
from arealite.engine.fsdp_engine import FSDPEngine
from arealite.engine.functional import gather_logprobs
from arealite.rollout.remote_engine import RemoteInferenceEngine
from tests.support.fsdp_helpers import engine_config, random_trajectories
from tests.support.http_calls import wait_tokens
from tests.support.procs import embedded_server

pytestmark = pytest.mark.integration

LORA = LoRAConfig(rank=4, alpha=8.0, init_lora_weights=False,
                  target_modules=["q_proj", "v_proj", "up_proj"])
PROMPT = [5, 17, 42, 8, 99]


def lora_engine(model_dir, with_optim: bool = True) -> FSDPEngine:
    kw = {} if with_optim else {"optimizer": None}
    e = FSDPEngine(engine_config(model_dir, lora=LORA, **kw), device="cpu", backend="gloo")
    e.initialize()
    return e


def logprobs(engine: FSDPEngine, out: list[int]) -> torch.Tensor:
    row = {"input_ids": PROMPT + out, "loss_mask": [0] * len(PROMPT) + [1] * len(out)}
    return engine.forward(pad_sequences_to_tensors([row]))[0, len(PROMPT):]


def sft_step(e: FSDPEngine) -> None:
    def loss(logits, mb):
        m = mb["loss_mask"].float()
        return -(gather_logprobs(logits, mb["labels"]) * m).sum() / m.sum().clamp_min(1)

    e.train_batch(random_trajectories(4, seed=7), loss, lambda mb: mb["loss_mask"].sum())


def request(n: int) -> ModelRequest:
    return ModelRequest(input_ids=list(PROMPT), gconfig=GenerationHyperparameters(
        max_new_tokens=n, ignore_eos=True, temperature=1.0))


def wait_running(base: str, timeout: float = 30.0) -> None:
    """Until the server's batch holds a running request."""
    deadline = time.monotonic() + timeout
    while requests.get(f"{base}/v1/loads", timeout=5).json()["loads"][0]["num_running_reqs"] == 0:
        assert time.monotonic() < deadline, "no request started running"
        time.sleep(0.01)


def test_adapter_versions_pushed_beside_each_other(tiny_model_dir, tmp_path):
    actor = lora_engine(tiny_model_dir)
    with embedded_server(str(tiny_model_dir), ["--enable-lora", "--weight-load-root",
                                               str(tmp_path), "--random-seed", "0"]) as addr:
        base = f"http://{addr}"
        client = RemoteInferenceEngine(InferenceEngineConfig(
            setup_timeout=30, request_timeout=120, weight_update_timeout=60,
            max_head_offpolicyness=1, health_check_interval=0.2))
        client.initialize([addr])
        try:
            def push(v: int) -> WeightUpdateMeta:
                meta = WeightUpdateMeta(type="disk", path=str(tmp_path / f"v{v}"), version=v,
                                        lora_name=f"run-v{v}")
                fut = client.update_weights(meta)
                actor.upload_weights(meta)
                fut.result(60)
                client.set_version(v)
                return meta

            # before any push: the base model, version 0
            r0 = client.executor.run_coroutine(client.agenerate(request(4))).result(60)
            assert r0.output_versions == [0] * 4
            push(1)
            assert client.adapters.current == ("run-v1", 1)
            # a long request on v1, held in the server's batch (the test's in-place pause) so
            # that it is surely running across the push of v2
            fut = client.executor.run_coroutine(client.agenerate(request(300)))
            wait_running(base)
            requests.post(f"{base}/pause_generation", json={"mode": "in_place"}, timeout=10)
            sft_step(actor)
            push(2)  # loads with the server paused: the push itself never pauses anything
            requests.post(f"{base}/continue_generation", json={}, timeout=10)
            r1 = fut.result(120)
            assert r1.stop_reason == "length" and r1.output_versions == [1] * 300
            v1 = lora_engine(tiny_model_dir, with_optim=False)
            v1.load(SaveLoadMeta(path=str(tmp_path / "v1"), weight_format="hf",
                                 with_optim=False))
            got = torch.tensor(r1.output_logprobs)
            assert float((got - logprobs(v1, r1.output_tokens)).abs().max()) < 1e-5
            # new requests: the newest adapter, the trainer's current weights
            r2 = client.executor.run_coroutine(client.agenerate(request(16))).result(60)
            assert r2.output_versions == [2] * 16
            got = torch.tensor(r2.output_logprobs)
            assert float((got - logprobs(actor, r2.output_tokens)).abs().max()) < 1e-5
            assert float((got - logprobs(v1, r2.output_tokens)).abs().max()) > 1e-4
            v1.destroy()
            # v3 with staleness bound 1: v1 is unloaded, v2 still served
            sft_step(actor)
            push(3)
            for name, ok in (("run-v1", False), ("run-v2", True), ("run-v3", True)):
                r = requests.post(f"{base}/generate", timeout=30, json={
                    "input_ids": PROMPT, "lora_path": name,
                    "sampling_params": {"max_new_tokens": 1}})
                assert (r.status_code == 200) == ok, (name, r.text)
            # a bad adapter folder: the update fails naming it, the run's v3 keeps serving
            bad = WeightUpdateMeta(type="disk", path=str(tmp_path / "nothing"), version=4,
                                   lora_name="run-v4", timeout=5)
            (tmp_path / "nothing").mkdir()
            bad.write_disk_marker()
            with pytest.raises(Exception, match="run-v4|not a LoRA adapter"):
                client.update_weights(bad).result(30)
            assert client.adapters.current == ("run-v3", 3)
            # the server left the pool; the probe loads v3 on it afresh and re-admits it
            r3 = client.executor.run_coroutine(client.agenerate(request(8))).result(60)
            assert r3.output_versions == [3] * 8
        finally:
            client.destroy()
            actor.destroy()


def test_adapter_pushed_in_memory_and_with_a_pause(tiny_model_dir):
    """``weight_update.type=tensor`` with LoRA: trainer rank 0 hands the adapter to the server
    by shared-memory reference (``/load_lora_adapter_from_tensors``), no file written; requests
    get the trainer's logprobs and the version. With ``lora_pause`` a push is pause -> load ->
    continue: a request in flight is cut (abort) and resumes on the new adapter, every token
    tagged with the version that made it. A server re-admitted after a failure gets the current
    adapter from the client's copy."""
    actor = lora_engine(tiny_model_dir)
    with embedded_server(str(tiny_model_dir), ["--enable-lora", "--random-seed", "0"]) as addr:
        base = f"http://{addr}"
        client = RemoteInferenceEngine(InferenceEngineConfig(
            setup_timeout=30, request_timeout=120, weight_update_timeout=60,
            max_head_offpolicyness=0, health_check_interval=0.2, pause_mode="abort"))
        client.initialize([addr])

        def push(v: int, pause: bool = False) -> None:
            meta = WeightUpdateMeta.tensor(v, timeout=60)
            meta.lora_name, meta.lora_pause = f"mem-v{v}", pause
            fut = client.update_weights(meta)
            actor.upload_weights(meta)
            fut.result(60)
            client.set_version(v)

        try:
            for v in (1, 2):
                push(v)
                r = client.executor.run_coroutine(client.agenerate(request(12))).result(60)
                assert r.output_versions == [v] * 12
                got = torch.tensor(r.output_logprobs)
                assert float((got - logprobs(actor, r.output_tokens)).abs().max()) < 1e-5
                sft_step(actor)
            # a long request on v2, held in the batch (the test's in-place pause) with some
            # tokens made, then a pausing push of v3 cuts it. Paused as soon as it has tokens, not
            # after a fixed wait: on a quiet machine 300 tokens took less than the 0.2 s slept here
            fut = client.executor.run_coroutine(client.agenerate(request(300)))
            wait_tokens(base, len(PROMPT) + 2)  # the prompt and 3 tokens (the last not in KV)
            requests.post(f"{base}/pause_generation", json={"mode": "in_place"}, timeout=10)
            push(3, pause=True)
            r = fut.result(120)
            k = r.output_versions.count(2)
            assert r.output_versions == [2] * k + [3] * (300 - k) and 0 < k < 300, k
            full = logprobs(actor, r.output_tokens)  # the v3 tokens: the v3 adapter's
            got = torch.tensor(r.output_logprobs)
            assert float((got[k:] - full[k:]).abs().max()) < 1e-5
            loaded = requests.get(f"{base}/v1/models", timeout=10).json()["data"]
            assert [c["id"] for c in loaded[1:]] == ["mem-v3"]  # older ones past the bound
            # the server fails and comes back empty-handed: the probe reloads mem-v3 on it
            requests.post(f"{base}/unload_lora_adapter", json={"lora_name": "mem-v3"},
                          timeout=10)
            client.pool.mark_unhealthy(addr, "test: taken out")
            deadline = time.monotonic() + 30
            while not client.pool.healthy_addrs():
                assert time.monotonic() < deadline, client.pool.describe()
                time.sleep(0.05)
            r = client.executor.run_coroutine(client.agenerate(request(4))).result(60)
            assert r.output_versions == [3] * 4
        finally:
            client.destroy()
            actor.destroy()


def test_two_runs_share_a_server_each_with_its_own_adapters(tiny_model_dir, tmp_path):
    """Item 5: two runs (two clients, two trainers) on one server, each pushing its own adapter
    versions under its own names: each run's requests get its own trainer's logprobs, never the
    other's, and one run's staleness unloads only its own old versions."""
    actors = {"a": lora_engine(tiny_model_dir), "b": lora_engine(tiny_model_dir)}
    sft_step(actors["b"])  # the runs' adapters differ from the start
    with embedded_server(str(tiny_model_dir), ["--enable-lora", "--weight-load-root",
                                               str(tmp_path), "--random-seed", "0"]) as addr:
        clients = {}
        try:
            for run in actors:
                clients[run] = RemoteInferenceEngine(InferenceEngineConfig(
                    setup_timeout=30, request_timeout=120, weight_update_timeout=60,
                    max_head_offpolicyness=1, health_check_interval=0.2))
                clients[run].initialize([addr])

            def push(run: str, v: int) -> None:
                meta = WeightUpdateMeta(type="disk", path=str(tmp_path / f"{run}{v}"), version=v,
                                        lora_name=f"{run}-v{v}")
                fut = clients[run].update_weights(meta)
                actors[run].upload_weights(meta)
                fut.result(60)
                clients[run].set_version(v)

            def sample(run: str, n: int):
                c = clients[run]
                return c.executor.run_coroutine(c.agenerate(request(n))).result(60)

            push("a", 1)
            push("b", 1)
            for run, other in (("a", "b"), ("b", "a")):
                r = sample(run, 16)
                assert r.output_versions == [1] * 16
                got = torch.tensor(r.output_logprobs)
                assert float((got - logprobs(actors[run], r.output_tokens)).abs().max()) < 1e-5
                assert float((got - logprobs(actors[other], r.output_tokens)).abs().max()) > 1e-4
            # run a moves on to v3 (bound 1): its v1 goes, run b's v1 stays and still serves b
            for v in (2, 3):
                sft_step(actors["a"])
                push("a", v)
            loaded = {name: requests.post(f"http://{addr}/generate", timeout=30, json={
                "input_ids": PROMPT, "lora_path": name, "sampling_params": {"max_new_tokens": 1},
            }).status_code for name in ("a-v1", "a-v3", "b-v1")}
            assert loaded == {"a-v1": 400, "a-v3": 200, "b-v1": 200}, loaded
            r = sample("b", 8)
            got = torch.tensor(r.output_logprobs)
            assert r.output_versions == [1] * 8
            assert float((got - logprobs(actors["b"], r.output_tokens)).abs().max()) < 1e-5
        finally:
            for c in clients.values():
                c.destroy()
            for a in actors.values():
                a.destroy()
