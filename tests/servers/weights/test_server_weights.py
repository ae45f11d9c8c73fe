"""Weight updates: from disk (with rollback) and from a separate rank-0 process over gloo."""

from __future__ import annotations

import concurrent.futures as cf
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
import torch

from servers.weights.loading import apply_named_tensors

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[3]


def post(base, path, body, timeout=60):
    return requests.post(f"{base}{path}", json=body, timeout=timeout)


def weights_of(base, name, n=1000):
    r = post(base, "/get_weights_by_name", {"name": name, "truncate_size": n})
    assert r.status_code == 200, r.text
    return torch.tensor(r.json())


def wait_running(base, n, timeout=20.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        st = requests.get(f"{base}/server_info", timeout=10).json()["internal_states"][0]
        if st["num_running_reqs"] >= n:
            return
        time.sleep(0.02)
    raise AssertionError("requests never started running")


def long_batch(base, result, rows=24, tokens=400):
    result["out"] = post(base, "/generate", {
        "input_ids": [[3, 4, 5]] * rows, "return_logprob": True,
        "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True}}, timeout=120).json()


def test_apply_named_tensors_restores_on_failure(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    before = model.model.norm.weight.detach().clone()
    bad = [("model.norm.weight", torch.zeros_like(before)),
           ("lm_head.weight", torch.empty(model.lm_head.weight.shape, device="meta"))]
    with pytest.raises(NotImplementedError):  # copying out of a meta tensor fails midway
        apply_named_tensors(model, bad)
    assert torch.equal(model.model.norm.weight, before)
    with pytest.raises(KeyError):
        apply_named_tensors(model, [("nope", before)])


def test_update_from_disk_and_rollback(server, tiny_model_dir, tmp_path):
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05)
    new_dir = tmp_path / "v5"
    model.save_pretrained(str(new_dir))
    r = post(server, "/update_weights_from_disk", {"model_path": str(new_dir), "weight_version": "5"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body == {"success": True, "num_paused_requests": 0,
                    "message": "Succeeded to update model weights. Weight version updated to 5."}
    expect = model.model.norm.weight.detach()
    assert torch.allclose(weights_of(server, "model.norm.weight"), expect)
    info = requests.get(f"{server}/model_info", timeout=10).json()
    assert info["weight_version"] == "5" and info["model_path"] == str(new_dir)
    out = post(server, "/generate", {"input_ids": [3], "sampling_params": {"max_new_tokens": 2}}).json()
    assert out["meta_info"]["weight_version"] == "5"

    broken = tmp_path / "broken"
    broken.mkdir()
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    sd["model.norm.weight"] = torch.zeros(3)  # wrong shape: the whole load must be refused
    sd["model.embed_tokens.weight"] = sd["model.embed_tokens.weight"] * 0
    save_file(sd, str(broken / "model.safetensors"))
    r = post(server, "/update_weights_from_disk", {"model_path": str(broken), "weight_version": "6"})
    assert r.status_code == 400 and r.json()["success"] is False
    assert "Rolling back to original weights" in r.json()["message"]
    assert torch.allclose(weights_of(server, "model.norm.weight"), expect)
    emb = weights_of(server, "model.embed_tokens.weight", 2)
    assert torch.allclose(emb, model.model.embed_tokens.weight[:2].detach())
    missing = post(server, "/update_weights_from_disk", {"model_path": str(tmp_path / "nope")})
    assert missing.status_code == 400 and "Failed to get weights iterator" in missing.json()["message"]
    assert requests.get(f"{server}/model_info", timeout=10).json()["weight_version"] == "5"
    # back to the original weights and version for the other tests of this module
    r = post(server, "/update_weights_from_disk", {"model_path": str(tiny_model_dir),
                                                    "weight_version": "default"})
    assert r.status_code == 200


def test_distributed_update_per_tensor_and_bucket_with_spans(server, tiny_model_dir, tmp_path):
    from servers.net import find_free_port
    from tests.support.procs import log_tail, spawn

    port = find_free_port()
    group = "weight_update_group"
    cmd = [sys.executable, str(REPO / "tests/support/server_weight_sender.py"), str(tiny_model_dir),
           str(port), "2", group, str(tmp_path)]
    # Without begin_weight_update the call is refused (and must not join the broadcast).
    r = post(server, "/update_weights_from_distributed",
             {"names": ["x"], "dtypes": ["float32"], "shapes": [[1]]})
    assert r.status_code == 400 and "must run between" in r.json()["message"]
    with spawn(cmd, env={"PYTHONPATH": str(REPO)}) as (proc, log):
        init = post(server, "/init_weights_update_group", {
            "master_address": "127.0.0.1", "master_port": str(port), "rank_offset": 1,
            "world_size": 2, "group_name": group, "backend": "gloo"}, timeout=90)
        assert init.status_code == 200, (init.text, log_tail(log))
        assert init.json()["message"] == "Succeeded to initialize custom process group."

        from transformers import AutoModelForCausalLM

        ref = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
        names = [n for n, _ in ref.named_parameters()]
        shapes = [list(p.shape) for _, p in ref.named_parameters()]
        meta = {"names": names, "dtypes": ["float32"] * len(names), "shapes": shapes,
                "group_name": group, "flush_cache": False}

        result: dict = {}
        t = threading.Thread(target=long_batch, args=(server, result))
        t.start()
        wait_running(server, 24)
        assert post(server, "/pause_generation", {"mode": "in_place"}).status_code == 200
        assert post(server, "/begin_weight_update", {}).json()["success"] is True
        again = post(server, "/begin_weight_update", {})
        assert again.status_code == 400 and "already open" in again.json()["message"]
        up = post(server, "/update_weights_from_distributed", {**meta, "weight_version": "1"}, 90)
        assert up.status_code == 200, (up.text, log_tail(log))
        assert up.json()["message"] == ("Succeeded to update parameter online. "
                                        "Weight version updated to 1.")
        sent1 = torch.load(tmp_path / "round1.pt")
        for name in ("model.norm.weight", "lm_head.weight", "model.layers.1.mlp.up_proj.weight"):
            assert torch.equal(weights_of(server, name), sent1[name][:1000])
        assert post(server, "/end_weight_update", {}).json()["success"] is True
        assert post(server, "/continue_generation", {}).status_code == 200
        t.join(120)
        for item in result["out"]:
            spans = item["meta_info"]["weight_versions"]
            assert [s["version"] for s in spans] == ["default", "1"], spans
            assert spans[0]["start"] == 0 and spans[0]["end"] == spans[1]["start"] > 0
            assert spans[1]["end"] == len(item["output_ids"]) == 400

        # Round 2: one flattened bucket, while idle (no pause needed: writer lock).
        assert post(server, "/begin_weight_update", {}).json()["success"] is True
        up = post(server, "/update_weights_from_distributed",
                  {**meta, "load_format": "flattened_bucket", "weight_version": "2",
                   "flush_cache": True}, 90)
        assert up.status_code == 200, (up.text, log_tail(log))
        assert post(server, "/end_weight_update", {}).json()["success"] is True
        sent2 = torch.load(tmp_path / "round2.pt")
        for name in ("model.norm.weight", "model.embed_tokens.weight"):
            assert torch.equal(weights_of(server, name), sent2[name][:1000])
        assert requests.get(f"{server}/model_info", timeout=10).json()["weight_version"] == "2"

        # Round 3: a smaller bucket (first half of the tensors) lands in the reused receive
        # buffer; the second half keeps round 2's values.
        half = len(names) // 2
        assert post(server, "/begin_weight_update", {}).json()["success"] is True
        up = post(server, "/update_weights_from_distributed",
                  {**meta, "names": names[:half], "dtypes": meta["dtypes"][:half],
                   "shapes": shapes[:half], "load_format": "flattened_bucket",
                   "weight_version": "3"}, 90)
        assert up.status_code == 200, (up.text, log_tail(log))
        assert post(server, "/end_weight_update", {}).json()["success"] is True
        sent3 = torch.load(tmp_path / "round3.pt")
        assert set(sent3) == set(names[:half])
        for name in (names[0], names[half - 1]):
            assert torch.equal(weights_of(server, name), sent3[name][:1000])
        for name in (names[half], names[-1]):
            assert torch.equal(weights_of(server, name), sent2[name][:1000])
        proc.wait(timeout=60)
        assert proc.returncode == 0, log_tail(log)
    bye = post(server, "/destroy_weights_update_group", {"group_name": group})
    assert bye.json() == {"success": True, "message": "Succeeded to destroy custom process group."}
    gone = post(server, "/destroy_weights_update_group", {"group_name": group})
    assert gone.status_code == 400
    assert gone.json()["message"] == "The group to be destroyed does not exist."
    end = post(server, "/end_weight_update", {})
    assert end.status_code == 400 and "no weight-update session" in end.json()["message"]


def test_update_weight_version_and_tensor_path(server):
    from arealite.weights.shared_tensors import serialize_named_tensors

    r = post(server, "/update_weight_version", {"new_version": "9", "abort_all_requests": False})
    assert r.json() == {"success": True, "message": "Weight version updated to 9", "new_version": "9"}
    norm = weights_of(server, "model.norm.weight")
    payload = {"serialized_named_tensors": [serialize_named_tensors([("model.norm.weight", norm * 2)])],
               "weight_version": "10"}
    # SGLang's payload, callable on its own (tests/servers/weights/test_tensor_update.py has the rest)
    r = post(server, "/update_weights_from_tensor", payload)
    assert r.status_code == 200, r.text
    assert torch.allclose(weights_of(server, "model.norm.weight"), norm * 2)
    assert requests.get(f"{server}/model_info", timeout=10).json()["weight_version"] == "10"


def test_pause_modes(server):
    base = server
    # abort: in-flight calls return partial output, and pause returns only after they did.
    res: dict = {}
    t = threading.Thread(target=long_batch, args=(base, res, 8, 500))
    t.start()
    wait_running(base, 8)
    assert post(base, "/pause_generation", {"mode": "abort"}).json() == {
        "message": "Generation paused successfully.", "status": "ok"}
    # Pause returned once every in-flight call had answered (their bytes may still be in flight).
    t.join(10)
    assert not t.is_alive()
    for item in res["out"]:
        assert item["meta_info"]["finish_reason"]["type"] == "abort"
        assert len(item["output_ids"]) < 500
    # a request sent while paused waits, then runs after continue
    with cf.ThreadPoolExecutor(1) as ex:
        fut = ex.submit(post, base, "/generate", {"input_ids": [3], "sampling_params": {"max_new_tokens": 3}})
        time.sleep(0.5)
        assert not fut.done()
        assert post(base, "/continue_generation", {}).status_code == 200
        assert fut.result(30).status_code == 200
    # retract and in_place: the original calls finish normally after continue
    for mode in ("retract", "in_place"):
        res = {}
        t = threading.Thread(target=long_batch, args=(base, res, 8, 300))
        t.start()
        wait_running(base, 8)
        assert post(base, "/pause_generation", {"mode": mode}).status_code == 200
        time.sleep(0.3)
        assert "out" not in res
        flush = requests.post(f"{base}/flush_cache", timeout=10)
        assert flush.status_code == (200 if mode == "retract" else 400)
        assert post(base, "/continue_generation", {}).status_code == 200
        t.join(60)
        for item in res["out"]:
            assert item["meta_info"]["finish_reason"] == {"type": "length", "length": 300}
            assert item["meta_info"]["num_retractions"] == (1 if mode == "retract" else 0)


def test_bucket_buffer_grows_and_is_reused():
    from servers.weights.loading import BucketBuffer

    buf = BucketBuffer()
    a = buf.take(100, "cpu")
    assert a.shape == (100,) and a.dtype == torch.uint8
    b = buf.take(40, torch.device("cpu"))  # smaller: a view of the same storage
    assert b.shape == (40,) and b.data_ptr() == a.data_ptr()
    c = buf.take(300, "cpu")  # larger: a new buffer, kept for later calls
    assert c.shape == (300,) and buf.take(300, "cpu").data_ptr() == c.data_ptr()
