"""RemoteInferenceEngine with the vLLM protocol against two real vLLM servers on CPU (the
``make setup-vllm`` virtualenv; no mock of vLLM): logprobs against the trainer's recompute, a
generation cut by a disk update and resumed with per-token versions, a server killed
mid-run.

The tests share one pair of servers (a cold start costs 30-60 s each; they stop with the module)
and run in file order: the update test moves the weights, the failover test kills one, and the
native-transfer update-body test (a failed receive breaks a vLLM server) runs last.
"""

from __future__ import annotations

import os
import time

import pytest
import requests
import torch

from arealite.api.config.actor import LoRAConfig
from arealite.api.config.rollout import InferenceEngineConfig
from arealite.api.io_struct import WeightUpdateError, WeightUpdateMeta
from arealite.backends.vllm.protocol import VLLM
from arealite.backends.vllm.server_command import lora_flags
from arealite.rollout.remote_engine import RemoteInferenceEngine
from tests.rollout.test_remote_engine_integration import (
    check_versions_match_weights,
    perturbed_state,
    request,
    run_all,
    save_model,
    start_all,
)
from tests.support.procs import VLLMServers, vllm_available

pytestmark = [
    pytest.mark.integration,
    pytest.mark.long,  # a vLLM start and eight tests on it
    pytest.mark.skipif(not vllm_available(), reason="no .venv-vllm: run make setup-vllm"),
]


@pytest.fixture(scope="module")
def vllm_pool(tiny_model_dir):
    # --enforce-eager: no torch.compile warm-up (about 20 s of each start on 2 cores); these
    # tests are about the protocol, tests/trainer/test_vllm_grpo.py runs the launcher's flags
    # --weight-transfer-config: vLLM's NCCL transfer engine, whose routes the native-transfer
    # tests call (on CPU they check payloads; the NCCL group itself needs GPUs). LoRA enabled
    # as the launcher enables it for a LoRA run (test_lora_adapter_push).
    flags, env = lora_flags(LoRAConfig(rank=8), 0)
    servers = VLLMServers(tiny_model_dir, 2, extra_args=(
        "--enforce-eager", "--weight-transfer-config", '{"backend": "nccl"}', *flags))
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        servers.start()
        yield servers
    finally:
        servers.close()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def generated_tokens(addrs: list[str]) -> float:
    """Tokens the pool's vLLM servers have generated so far (their Prometheus counter)."""
    total = 0.0
    for a in addrs:
        for line in requests.get(f"http://{a}/metrics", timeout=5).text.splitlines():
            if line.startswith("vllm:generation_tokens_total"):
                total += float(line.rsplit(" ", 1)[1])
    return total


def make_engine(addrs, **kw) -> RemoteInferenceEngine:
    cfg = InferenceEngineConfig(setup_timeout=60, request_timeout=120, weight_update_timeout=60,
                                **kw)
    eng = RemoteInferenceEngine(cfg, protocol=VLLM)
    eng.initialize(addrs)
    return eng


def test_logprobs_match_the_trainers_recompute(vllm_pool, tiny_model_dir):
    """Invariant 4 on vLLM: fp32 server logprobs of sampled tokens (temperature 1 and 0.7)
    equal the trainer's teacher-forced recompute; tokens carry the launch version (0)."""
    from transformers import AutoModelForCausalLM

    from arealite.engine.functional import gather_logprobs

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    eng = make_engine(vllm_pool.addrs)
    try:
        reqs = [request(f"lp{i}", 48, prompt=[5, 6, 7 + i], temperature=t)
                for i, t in enumerate([1.0, 1.0, 0.7, 0.7])]
        out = run_all(eng, reqs)
        worst = 0.0
        for q, r in zip(reqs, out):
            assert r.output_len == 48 and r.output_versions == [0] * 48
            ids = torch.tensor([q.input_ids + r.output_tokens])
            with torch.no_grad():
                logits = model(ids).logits[0, len(q.input_ids) - 1:-1]
            ref = gather_logprobs(logits, torch.tensor(r.output_tokens),
                                  temperature=q.gconfig.temperature)
            worst = max(worst, (torch.tensor(r.output_logprobs) - ref).abs().max().item())
        assert worst <= 1e-4, worst
        assert {r.server for r in out} == set(vllm_pool.addrs)  # both servers served
    finally:
        eng.destroy()


def test_lora_adapter_push(vllm_pool, tiny_model_dir, tmp_path):
    """A LoRA push to vLLM (``/v1/load_lora_adapter``, no pause) and requests naming the adapter
    by ``model``: every token carries the adapter's version and the trainer's peft logprob;
    the next push unloads it (staleness bound 0)."""
    from arealite.api.io_struct import ModelRequest
    from arealite.api.trajectory import pad_sequences_to_tensors
    from arealite.engine.fsdp_engine import FSDPEngine
    from tests.support.fsdp_helpers import engine_config

    lcfg = LoRAConfig(rank=8, alpha=16.0, init_lora_weights=False,
                      target_modules=["q_proj", "v_proj", "up_proj"])
    actor = FSDPEngine(engine_config(tiny_model_dir, lora=lcfg, optimizer=None), device="cpu",
                       backend="gloo")
    actor.initialize()
    eng = make_engine(vllm_pool.addrs)
    try:
        meta = WeightUpdateMeta(type="disk", path=str(tmp_path / "v1"), version=1,
                                lora_name="run-v1")
        fut = eng.update_weights(meta)
        actor.upload_weights(meta)
        fut.result(60)
        prompt = [5, 17, 42, 8, 99]
        reqs = [ModelRequest(rid=f"lora{i}", input_ids=prompt, gconfig=request("x", 12).gconfig)
                for i in range(2)]
        for r in run_all(eng, reqs):
            assert r.output_versions == [1] * 12
            row = {"input_ids": prompt + r.output_tokens, "loss_mask": [0] * 5 + [1] * 12}
            want = actor.forward(pad_sequences_to_tensors([row]))[0, 5:]
            assert float((torch.tensor(r.output_logprobs) - want).abs().max()) < 1e-5
        # vLLM's OpenAI route names the adapter by ``model`` alone; an unknown one is a 404
        url = f"http://{vllm_pool.addrs[0]}/v1/completions"
        r = requests.post(url, timeout=60, json={
            "model": "run-v1", "prompt": prompt, "max_tokens": 6, "logprobs": 0,
            "return_tokens_as_token_ids": True})
        assert r.status_code == 200, r.text
        lp = r.json()["choices"][0]["logprobs"]
        ids = [int(t.removeprefix("token_id:")) for t in lp["tokens"]]
        row = {"input_ids": prompt + ids, "loss_mask": [0] * 5 + [1] * len(ids)}
        want = actor.forward(pad_sequences_to_tensors([row]))[0, 5:]
        got = torch.tensor(lp["token_logprobs"])
        assert float((got - want).abs().max()) < 1e-5
        r = requests.post(url, timeout=60, json={"model": "run-v9", "prompt": prompt,
                                                 "max_tokens": 2})
        assert r.status_code == 404 and "run-v9" in r.text, r.text
        meta2 = WeightUpdateMeta(type="disk", path=str(tmp_path / "v1"), version=2,
                                 lora_name="run-v2")
        meta2.write_disk_marker()  # the same adapter again, under the next version's name
        eng.update_weights(meta2).result(60)
        assert list(eng.adapters.loaded) == [2]  # run-v1 unloaded from both servers
    finally:
        eng.destroy()
        actor.destroy()


def test_pause_disk_update_resume_keeps_per_token_versions(vllm_pool, tiny_model_dir, tmp_path):
    """Invariant 3 on vLLM: a disk update lands mid-generation (``/pause?mode=abort``, in-place
    ``reload_weights``, ``/resume``); the cut requests resume with their partial tokens, every
    token keeps the version vLLM reports for it, and its logprob is that version's."""
    eng = make_engine(vllm_pool.addrs, sticky_rids=True, pause_mode="abort")
    states: dict[int, dict | None] = {0: None}
    try:
        # The update goes out once vLLM has generated some of the tokens, not after a fixed
        # sleep (on a quiet machine the 4 x 400 tokens took under a second). Still, on a quiet
        # machine the requests can all end before the pause lands (no cut; once in a clean-clone
        # CI run): that is the scenario missed, not the invariant broken, so it runs again, one
        # version up, at most three times; every attempt's tokens are checked all the same.
        cut = 0
        for v in (1, 2, 3):
            states[v] = perturbed_state(tiny_model_dir, seed=10 + v)
            meta = WeightUpdateMeta(type="disk", version=v, path=str(tmp_path / f"v{v}"))
            save_model(tiny_model_dir, states[v], tmp_path / f"v{v}")
            meta.write_disk_marker()
            n = 400  # prompt + n < --max-model-len 512
            reqs = [request(f"cut{v}-{i}", n, prompt=[5, 6, 7 + i]) for i in range(4)]
            base = generated_tokens(vllm_pool.addrs)
            fut = start_all(eng, reqs)
            deadline = time.monotonic() + 60
            while (generated_tokens(vllm_pool.addrs) - base < 4 * len(reqs) and not fut.done()
                   and time.monotonic() < deadline):
                time.sleep(0.005)
            t0 = time.monotonic()
            eng.update_weights(meta).result(60)
            update_s = time.monotonic() - t0
            assert update_s < 30, update_s
            out = fut.result(120)
            assert eng.get_version() == v
            for q, r in zip(reqs, out):
                assert r.output_len == n and len(r.output_logprobs) == n
                got = r.output_versions
                k = got.index(v) if v in got else n
                assert got == [v - 1] * k + [v] * (n - k)  # one switch, nothing lost or doubled
                if 0 < k < n:
                    cut += 1
                    assert check_versions_match_weights(
                        tiny_model_dir, {v - 1: states[v - 1], v: states[v]}, q.input_ids, r) == k
            if cut:
                break
        assert cut >= 1, [r.output_versions.count(v) for r in out]
        after = run_all(eng, [request("after", 5)])[0]
        assert after.output_versions == [v] * 5
    finally:
        eng.destroy()


def test_tied_embeddings_update_is_refused_before_pausing(vllm_pool, tmp_path):
    import json

    tied = tmp_path / "tied"
    tied.mkdir()
    (tied / "config.json").write_text(json.dumps({"tie_word_embeddings": True}))
    meta = WeightUpdateMeta(type="disk", version=2, path=str(tied))
    meta.write_disk_marker()
    eng = make_engine(vllm_pool.addrs)
    try:
        eng.set_version(1)
        with pytest.raises(WeightUpdateError, match="tie_word_embeddings"):
            eng.update_weights(meta).result(30)
        assert eng.get_version() == 1 and eng.pool.healthy_addrs() == vllm_pool.addrs
    finally:
        eng.destroy()


def _post(addr: str, path: str, body) -> tuple[int, str]:
    import json
    import urllib.error
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://{addr}{path}", data=data, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _specs(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from arealite.weights.upload import param_specs

    return param_specs(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), 1.0)


def test_native_transfer_init_start_finish_on_real_vllm(vllm_pool, tiny_model_dir):
    """The client's native-transfer calls against real vLLM on CPU, each as far as it runs
    without CUDA: the init body passes vLLM's ``NCCLWeightTransferInitInfo`` and fails only at
    the missing accelerator (a misspelt field fails in the parser: the check is not vacuous);
    start then finish run and finish labels the version. (The transfer itself needs GPUs:
    docs/servers.md has the command; the update body is checked last, below.)"""
    import json

    from arealite.backends.vllm import weight_transfer as vt

    meta = WeightUpdateMeta.broadcast(5, _specs(tiny_model_dir), master_port=1)
    addr = vllm_pool.addrs[0]
    before = json.loads(urllib_get(addr, "/weight_info"))["weight_version"]
    code, text = _post(addr, vt.INIT, vt.init_payload(meta, 1, 2))
    assert code == 500 and "Cannot access accelerator device" in text, text
    bad = vt.init_payload(meta, 1, 2)
    bad["init_info"]["master_addr"] = bad["init_info"].pop("master_address")
    code, text = _post(addr, vt.INIT, bad)
    assert code == 500 and "Invalid init_info" in text, text
    assert _post(addr, vt.START, None)[0] == 200
    assert _post(addr, vt.FINISH, vt.finish_payload(5))[0] == 200
    assert json.loads(urllib_get(addr, "/weight_info"))["weight_version"] == "5"
    assert _post(addr, "/update_weight_version", {"new_version": before})[0] == 200


def urllib_get(addr: str, path: str) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://{addr}{path}", timeout=30) as r:
        return r.read().decode()


def test_native_transfer_on_cpu_servers_is_one_clear_error(vllm_pool, tiny_model_dir):
    """``weight_update.type=distributed`` driven against vLLM servers on CPU: the client makes
    vLLM's calls (``/get_world_size``, pause, ``/init_weight_transfer_engine`` at each server's
    rank offset), the init fails at the missing accelerator, and the error names
    ``weight_update.type=disk``; the servers are resumed, not left paused."""
    import json

    meta = WeightUpdateMeta.broadcast(2, _specs(tiny_model_dir), master_port=1)
    eng = make_engine(vllm_pool.addrs)
    try:
        with pytest.raises(WeightUpdateError, match="weight_update.type=disk") as ei:
            eng.update_weights(meta).result(60)
        assert "Cannot access accelerator device" in str(ei.value)
        assert meta.receiver == "vllm" and meta.world_size == 3 and meta.backend == "nccl"
        assert meta.abort_reason  # the trainer's send stops waiting for the group
        for a in vllm_pool.addrs:
            assert json.loads(urllib_get(a, "/is_paused"))["is_paused"] is False
    finally:
        eng.destroy()


def test_killed_vllm_server_loses_no_request(vllm_pool, caplog):
    # The servers carry whatever version the tests before left them at (the update test goes up
    # to three versions when a pause misses its requests): label them, then expect that label.
    version = 7
    for a in vllm_pool.addrs:
        assert _post(a, "/update_weight_version", {"new_version": str(version)})[0] == 200
    eng = make_engine(vllm_pool.addrs, sticky_rids=False, unhealthy_after_failures=1,
                      health_check_interval=0.5, request_retries=3)
    eng.set_version(version)
    dead = vllm_pool.addrs[1]
    try:
        n = 64
        reqs = [request(f"kill{i}", n) for i in range(8)]
        with caplog.at_level("WARNING", logger="arealite.rollout.remote_engine"):
            # Frozen first: a tiny model on vLLM finishes hundreds of tokens before a test can
            # see them in flight, so racing a kill against generation is a coin toss.
            vllm_pool.freeze(1)
            fut = start_all(eng, reqs)
            deadline = time.monotonic() + 10
            while eng.pool.servers[dead].inflight < 1 and time.monotonic() < deadline:
                time.sleep(0.005)
            assert eng.pool.servers[dead].inflight >= 1, "nothing was sent to the frozen server"
            vllm_pool.kill(1)  # SIGKILL with the requests in flight
            out = fut.result(120)
        retried = [m for m in caplog.messages if f"failed on {dead}" in m]
        assert retried, "no request was in flight on the killed server"
        got = [(i, r.output_len, sorted(set(r.output_versions)), r.server) for i, r in enumerate(out)]
        assert all(r.output_len == n and r.output_versions == [version] * n for r in out), got
        assert all(r.server == vllm_pool.addrs[0] for r in out), got
        assert dead in eng.pool.unhealthy_addrs()
    finally:
        eng.destroy()


def test_native_update_body_passes_vllms_parser(vllm_pool, tiny_model_dir):
    """Last: the ``/update_weights`` body passes vLLM's ``NCCLWeightTransferUpdateInfo`` and
    fails only for want of an NCCL group; a misspelt field fails in the parser. A failed receive
    leaves vLLM's model on the meta device (its next request kills the engine, which is why the
    client takes such a server out of the pool), so this runs on the pool's last use."""
    from arealite.backends.vllm import weight_transfer as vt

    addr = vllm_pool.addrs[0]
    body = vt.update_payload(_specs(tiny_model_dir))
    assert _post(addr, vt.START, None)[0] == 200
    code, text = _post(addr, vt.UPDATE, body)
    assert code == 500 and "NCCL weight transfer not initialized" in text, text
    body["update_info"]["dtypes"] = body["update_info"].pop("dtype_names")
    assert _post(addr, vt.START, None)[0] == 200  # the failed receive ended the session
    code, text = _post(addr, vt.UPDATE, body)
    assert code == 500 and "Invalid update_info" in text, text
