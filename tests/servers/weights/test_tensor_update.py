"""``/update_weights_from_tensor`` with SGLang's payload: tensors by shared-memory reference.

A push called on its own (as in SGLang) lands: the server's checksums and prompt logprobs equal
a local copy of the model given the same tensors (fp32, 1e-6); ``flattened_bucket`` works too.
Inside a session buckets are staged and applied together by the call with ``weight_version``; a
sender killed between buckets leaves the old weights serving. Malformed payloads get a 400
that names the problem.
"""

from __future__ import annotations

import base64
import io
import os
import pickle
import sys
import textwrap

import pytest
import requests
import torch

from arealite.weights.shared_tensors import serialize_flattened_bucket, serialize_named_tensors
from arealite.weights.verify import tensor_checksum
from tests.support.procs import spawn

pytestmark = pytest.mark.integration


def post(server: str, path: str, body: dict) -> requests.Response:
    return requests.post(f"{server}{path}", json=body, timeout=60)


def checksums(server: str) -> dict[str, str]:
    return post(server, "/weights_checker", {}).json()["ranks"][0]["checksums"]


def prompt_logprobs(server: str, ids: list[int]) -> torch.Tensor:
    out = post(server, "/generate", {"input_ids": ids, "return_logprob": True,
                                     "logprob_start_len": 0,
                                     "sampling_params": {"max_new_tokens": 1}}).json()
    return torch.tensor([e[0] for e in out["meta_info"]["input_token_logprobs"][1:]],
                        dtype=torch.float64)


@pytest.fixture(scope="module")
def local_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def perturbed(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: (p.detach() + 0.02 * torch.randn(p.shape, generator=g)).contiguous()
            for n, p in model.named_parameters()}


def buckets(state: dict[str, torch.Tensor], n: int) -> list[list[tuple[str, torch.Tensor]]]:
    items = list(state.items())
    k = -(-len(items) // n)
    return [items[i:i + k] for i in range(0, len(items), k)]


def test_a_shared_memory_push_on_its_own_matches_the_sender(server, local_model):
    state = perturbed(local_model, seed=1)
    for bucket in buckets(state, 3):  # no session: each call applies at once, as in SGLang
        r = post(server, "/update_weights_from_tensor",
                 {"serialized_named_tensors": [serialize_named_tensors(bucket)],
                  "weight_version": "7", "flush_cache": True})
        assert r.status_code == 200 and r.json()["success"], r.text
    assert all(t.is_shared() for t in state.values())  # the bytes went by shared memory
    assert checksums(server) == {n: tensor_checksum(t) for n, t in state.items()}
    assert requests.get(f"{server}/model_info", timeout=10).json()["weight_version"] == "7"
    local_model.load_state_dict(state, strict=False)
    ids = [5, 17, 3, 99, 42, 8, 61, 23, 4, 77, 12]
    with torch.no_grad():
        logits = local_model(torch.tensor([ids])).logits[0, :-1].double()
    mine = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
    assert float((prompt_logprobs(server, ids) - mine).abs().max()) < 1e-6


def test_flattened_bucket_payload(server, local_model):
    state = perturbed(local_model, seed=2)
    names = ["model.norm.weight", "model.layers.0.mlp.up_proj.weight"]
    parts = [state[n].reshape(-1).view(torch.uint8) for n in names]
    flat = torch.cat(parts)
    metas, off = [], 0
    for n, p in zip(names, parts):
        metas.append({"name": n, "shape": state[n].shape, "dtype": state[n].dtype,
                      "start_idx": off, "end_idx": off + p.numel(), "numel": state[n].numel()})
        off += p.numel()
    r = post(server, "/update_weights_from_tensor",
             {"serialized_named_tensors": [serialize_flattened_bucket(flat, metas)],
              "load_format": "flattened_bucket"})
    assert r.status_code == 200, r.text
    got = checksums(server)
    assert all(got[n] == tensor_checksum(state[n]) for n in names)


def test_session_buckets_apply_together_and_a_dead_sender_changes_nothing(
        server, local_model, tmp_path):
    before = checksums(server)
    state = perturbed(local_model, seed=3)
    # A sender that stages its first bucket and is killed before the last one.
    torch.save(state, tmp_path / "state.pt")
    script = textwrap.dedent(f"""
        import os, requests, torch
        from arealite.weights.shared_tensors import serialize_named_tensors
        state = list(torch.load({str(tmp_path / 'state.pt')!r}).items())
        body = {{"serialized_named_tensors": [serialize_named_tensors(state[:4])]}}
        r = requests.post({server + '/update_weights_from_tensor'!r}, json=body, timeout=60)
        assert r.status_code == 200 and "Staged" in r.json()["message"], r.text
        print("staged", flush=True)
        os.kill(os.getpid(), 9)
    """)
    assert post(server, "/begin_weight_update", {}).json()["success"]
    with spawn([sys.executable, "-c", script]) as (proc, log):
        proc.wait(timeout=120)  # killed by itself; its group (torch's shm manager) goes next
        out = open(log).read()
    assert proc.returncode == -9 and "staged" in out, out
    assert checksums(server) == before  # staged, never applied
    end = post(server, "/end_weight_update", {}).json()
    assert end["success"] and "Dropped 4 staged tensors" in end["message"]
    assert checksums(server) == before
    # the whole update in a session: nothing moves until the call with weight_version
    assert post(server, "/begin_weight_update", {}).json()["success"]
    bs = buckets(state, 2)
    r = post(server, "/update_weights_from_tensor",
             {"serialized_named_tensors": [serialize_named_tensors(bs[0])]})
    assert "Staged" in r.json()["message"] and checksums(server) == before
    r = post(server, "/update_weights_from_tensor",
             {"serialized_named_tensors": [serialize_named_tensors(bs[1])], "weight_version": "8"})
    assert r.json()["success"], r.text
    assert post(server, "/end_weight_update", {}).json()["message"] == "Success"
    assert checksums(server) == {n: tensor_checksum(t) for n, t in state.items()}


class _Evil:
    def __reduce__(self):
        return (os.system, ("true",))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_malformed_payloads_get_a_400_naming_the_problem(server):
    before = checksums(server)
    norm = torch.ones(64)
    torch_save = io.BytesIO()
    torch.save([("model.norm.weight", norm)], torch_save)
    cases = {
        "not valid base64": ["%%%"],
        "torch.save archive": [_b64(torch_save.getvalue())],
        "posix.system": [_b64(pickle.dumps([("x", _Evil())]))],
        "cannot unpickle": [_b64(b"\x80\x04\x95garbage")],
        "(name, tensor) pair": [_b64(pickle.dumps([("model.norm.weight", 3)]))],
        "unknown parameter 'nope'": [serialize_named_tensors([("nope", norm)])],
        "shape mismatch for model.norm.weight": [serialize_named_tensors(
            [("model.norm.weight", torch.ones(3))])],
        "has 2 entries": [serialize_named_tensors([("model.norm.weight", norm)])] * 2,
    }
    for needle, payload in cases.items():
        r = post(server, "/update_weights_from_tensor", {"serialized_named_tensors": payload})
        assert r.status_code == 400 and needle in r.json()["message"], (needle, r.text)
    r = post(server, "/update_weights_from_tensor", {"serialized_named_tensors": ["x"],
                                                     "load_format": "mystery"})
    assert r.status_code == 400 and "load_format 'mystery'" in r.json()["message"]
    r = post(server, "/update_weights_from_tensor", {"load_format": None})
    assert r.status_code == 400  # the required field is missing
    # a descriptor-shared tensor cannot be opened by another process: named, not a crash
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing as torch_mp

    old = torch_mp.get_sharing_strategy()
    torch_mp.set_sharing_strategy("file_descriptor")
    try:
        buf = io.BytesIO()
        ForkingPickler(buf).dump([("model.norm.weight", torch.ones(64))])
    finally:
        torch_mp.set_sharing_strategy(old)
    r = post(server, "/update_weights_from_tensor", {"serialized_named_tensors": [_b64(buf.getvalue())]})
    assert r.status_code == 400 and "set_sharing_strategy('file_system')" in r.json()["message"]
    assert checksums(server) == before


def test_the_trainers_push_reaches_every_server_of_its_rank_every_time(server, local_model):
    """``upload_by_reference`` with two targets (here the same server twice), two versions in a
    row: each receiver gets its own payload, so no shared block is freed under a later push."""
    from arealite.api.io_struct import WeightUpdateMeta
    from arealite.weights.tensor import upload_by_reference

    addr = server.removeprefix("http://")
    for version, seed in ((21, 5), (22, 6)):
        state = perturbed(local_model, seed=seed)
        local_model.load_state_dict(state, strict=False)
        meta = WeightUpdateMeta.tensor(version, bucket_size_mb=0.05, timeout=60)
        meta.targets, meta.verify = [addr, addr], True
        upload_by_reference(local_model, meta, rank=0, world=1)
        assert meta.target_failures == {}
        got = checksums(server)
        assert {n: c for n, (_, c) in meta.checksums.items()} == got
        assert requests.get(f"{server}/model_info", timeout=10).json()["weight_version"] == str(version)


def held_bytes(server: str) -> int:
    info = requests.get(f"{server}/get_server_info", timeout=10).json()
    return info["internal_states"][0]["shared_weight_blocks_held_bytes"]


def test_a_senders_long_lived_blocks_stay_mapped_between_pushes(server, local_model):
    """Blocks named by two updates in a row stay mapped (a later push of them maps nothing);
    blocks seen once are never held; held ones go when an update stops naming them."""
    import gc

    def push(state: dict[str, torch.Tensor], version: str) -> None:
        r = post(server, "/update_weights_from_tensor",
                 {"serialized_named_tensors": [serialize_named_tensors(list(state.items()))],
                  "weight_version": version})
        assert r.status_code == 200 and r.json()["success"], r.text

    state = perturbed(local_model, seed=7)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    push(state, "31")
    assert held_bytes(server) == 0  # seen once: maybe a per-push copy, so not kept alive
    push(state, "32")
    assert held_bytes(server) == nbytes
    for t in state.values():  # the sender updates its blocks in place, as an optimizer does
        t.mul_(0.5)
    push(state, "33")  # served from the held mappings: the new values land all the same
    assert checksums(server) == {n: tensor_checksum(t) for n, t in state.items()}
    files = ["/dev/shm" + t.untyped_storage()._share_filename_cpu_()[1].decode()
             for t in state.values()]
    del state, t
    gc.collect()
    assert all(os.path.exists(f) for f in files)  # the server's mapping keeps them
    push(perturbed(local_model, seed=8), "34")  # other blocks: the held ones are let go
    assert held_bytes(server) == 0
    assert [f for f in files if os.path.exists(f)] == []
