"""The trainer's upload_weights against a live embedded server, driven by the real client.

After each update (disk, then distributed twice over one group) the server reports the new
version and its logprobs for a fixed completion equal the trainer's within 1e-5, and the
verified update (``meta.verify``) found the server's ``/weights_checker`` checksums equal to
those the trainer computed for every parameter it sent.
"""

from __future__ import annotations

import json
import urllib.request

import pytest
import torch

from arealite.api.config.rollout import InferenceEngineConfig
from arealite.api.io_struct import FinetuneSpec, WeightUpdateMeta
from arealite.engine.functional import gather_logprobs
from arealite.engine.ppo.actor import FSDPPPOActor
from arealite.utils.network import find_free_port
from arealite.weights.upload import WeightUploadError
from tests.support.fsdp_helpers import actor_config, random_trajectories
from tests.support.procs import embedded_server

pytestmark = pytest.mark.integration


def _post(addr: str, path: str, body: dict | None = None, timeout: float = 60.0) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://{addr}{path}", data=data,
                                 headers={"Content-Type": "application/json"},
                                 method="GET" if body is None else "POST")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def server_logprobs(addr: str, ids: list[int]) -> torch.Tensor:
    """Logprob of every token of ``ids`` after the first (prompt logprobs, temperature 1)."""
    out = _post(addr, "/generate", {
        "input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 1.0},
        "return_logprob": True, "logprob_start_len": 0,
    })
    entries = out["meta_info"]["input_token_logprobs"]
    assert len(entries) == len(ids) and entries[0][0] is None
    return torch.tensor([e[0] for e in entries[1:]], dtype=torch.float64)


def trainer_logprobs(actor: FSDPPPOActor, ids: list[int]) -> torch.Tensor:
    data = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.bool)}
    hook = lambda logits, mb: gather_logprobs(logits, mb["labels"], 1.0)  # noqa: E731
    return actor.forward(data, post_hook=hook)[0, 1:].double()


def _train_step(actor: FSDPPPOActor, seed: int) -> None:
    data = random_trajectories(4, seed=seed)
    data["prox_logp"] = actor.compute_logp(data)
    actor.compute_advantages(data)
    actor.ppo_update(data)


def _trained_actor(tiny_model_dir) -> tuple[FSDPPPOActor, list[int]]:
    """An actor with an optimizer, and a fixed 14-token sequence to compare logprobs on."""
    actor = FSDPPPOActor(actor_config(tiny_model_dir, recompute_logprob=False,
                                      use_decoupled_loss=False), device="cpu", backend="gloo")
    actor.initialize(ft_spec=FinetuneSpec(total_train_epochs=1, dataset_size=8, train_batch_size=1))
    ids = [int(t) for t in random_trajectories(1, seed=7, min_len=14, max_len=14)["input_ids"][0]]
    return actor, ids


def _client(addr: str):
    from arealite.rollout.remote_engine import RemoteInferenceEngine

    client = RemoteInferenceEngine(InferenceEngineConfig(
        server_addrs=[addr], setup_timeout=60, weight_update_timeout=60))
    client.initialize()
    return client


@pytest.mark.timeout(300)
def test_disk_then_distributed_updates_reach_the_server(tiny_model_dir, tmp_path):
    actor, ids = _trained_actor(tiny_model_dir)
    with embedded_server(tiny_model_dir, ["--weight-version", "0"]) as addr:
        client = _client(addr)
        try:
            # same weights at the start: the servers' and the trainer's logprobs agree
            assert float((server_logprobs(addr, ids) - trainer_logprobs(actor, ids)).abs().max()) < 1e-5
            updates = [
                WeightUpdateMeta(type="disk", version=1, path=str(tmp_path / "v1"), timeout=60),
                WeightUpdateMeta(type="distributed", version=2, master_port=find_free_port(),
                                 group_name="wu_live", timeout=60),
            ]
            updates.append(WeightUpdateMeta(type="distributed", version=3,
                                            master_port=updates[1].master_port,
                                            group_name="wu_live", timeout=60))
            for i, meta in enumerate(updates):
                _train_step(actor, seed=20 + i)
                mine = trainer_logprobs(actor, ids)
                assert float((server_logprobs(addr, ids) - mine).abs().max()) > 1e-4  # stale
                if meta.type.value == "distributed":
                    meta.param_specs = actor.get_param_specs(bucket_size_mb=0.1)
                meta.verify = True
                fut = client.update_weights(meta)
                actor.upload_weights(meta)
                fut.result(timeout=90)
                actor.set_version(meta.version)
                info = _post(addr, "/model_info")
                assert str(info["weight_version"]) == str(meta.version)
                diff = float((server_logprobs(addr, ids) - mine).abs().max())
                assert diff < 1e-5, (meta.type, diff)
                # verified: the trainer hashed every parameter, the server agreed on each
                got = _post(addr, "/weights_checker", {})["ranks"][0]["checksums"]
                assert set(meta.checksums) == set(got)
                assert {k: v[1] for k, v in meta.checksums.items()} == got
                assert client.last_weight_update.resync == []
            marker = json.loads((tmp_path / "v1" / "arealite_weights_ready.json").read_text())
            assert marker == {"version": 1}
        finally:
            client.destroy()
    actor.destroy()


@pytest.mark.timeout(60)
def test_a_dead_peer_cannot_hang_the_upload(tiny_model_dir):
    """Nobody joins the group: the upload fails within its timeout, with a clear error."""
    import time

    actor = FSDPPPOActor(actor_config(tiny_model_dir, optimizer=None), device="cpu", backend="gloo")
    actor.initialize()
    meta = WeightUpdateMeta(type="distributed", version=1, master_port=find_free_port(),
                            group_name="wu_dead", timeout=3)
    meta.param_specs = actor.get_param_specs(1.0)
    meta.world_size = 2
    t0 = time.monotonic()
    with pytest.raises(WeightUploadError, match="failed"):
        actor.upload_weights(meta)
    assert time.monotonic() - t0 < 20
    meta2 = WeightUpdateMeta(type="distributed", version=1, master_port=find_free_port(),
                             group_name="wu_dead", timeout=0.5)
    meta2.param_specs = meta.param_specs  # world_size never set by any client
    with pytest.raises(WeightUploadError, match="world_size"):
        actor.upload_weights(meta2)
    actor.destroy()


@pytest.mark.timeout(300)
def test_tensor_updates_by_shared_memory_reach_the_server(tiny_model_dir):
    """``weight_update.type: tensor``: the actor's buckets reach a server on its host by
    shared-memory reference (its parameters stay shared after the first push); the server's
    logprobs equal the trainer's to 1e-6 (fp32) and every checksum agrees."""
    actor, ids = _trained_actor(tiny_model_dir)
    with embedded_server(tiny_model_dir, ["--weight-version", "0"]) as addr:
        client = _client(addr)
        try:
            for version in (1, 2):
                _train_step(actor, seed=40 + version)
                mine = trainer_logprobs(actor, ids)
                assert float((server_logprobs(addr, ids) - mine).abs().max()) > 1e-4  # stale
                meta = WeightUpdateMeta.tensor(version, bucket_size_mb=0.05, timeout=60)
                meta.verify = True
                fut = client.update_weights(meta)
                actor.upload_weights(meta)
                fut.result(timeout=90)
                actor.set_version(version)
                assert meta.target_failures == {} and meta.targets == [addr]
                assert str(_post(addr, "/model_info")["weight_version"]) == str(version)
                diff = float((server_logprobs(addr, ids) - mine).abs().max())
                assert diff < 1e-6, diff
                got = _post(addr, "/weights_checker", {})["ranks"][0]["checksums"]
                assert {k: v[1] for k, v in meta.checksums.items()} == got
                assert client.last_weight_update.resync == []
            # one rank: the parameters themselves were shared, nothing is copied per push
            assert all(getattr(p, "_local_tensor", p).is_shared() for p in actor.model.parameters())
        finally:
            client.destroy()
    actor.destroy()
