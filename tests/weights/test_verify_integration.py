"""Verified weight updates against real embedded servers: ``/weights_checker`` agrees with the
trainer-side checksum in fp32 and bf16; a server whose weights were corrupted after an update
is caught, taken out, re-synced and re-admitted; a mismatch that survives the re-sync stops the
run with a clear error."""

from __future__ import annotations

import json
import logging
import urllib.request

import pytest
import torch

from arealite.api.io_struct import WeightUpdateMeta
from arealite.weights.shared_tensors import serialize_named_tensors
from arealite.weights.verify import WeightVerificationError, dtype_name, tensor_checksum
from tests.rollout.test_remote_engine_integration import (
    make_engine,
    perturbed_state,
    request,
    run_all,
    save_model,
)
from tests.support.procs import embedded_server

pytestmark = pytest.mark.integration


def _post(addr: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(f"http://{addr}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read() or b"null")


def corrupt(addr: str, name: str, value: torch.Tensor) -> None:
    """One parameter changed behind the client's back (as a bad transfer would leave it)."""
    _post(addr, "/update_weights_from_tensor",
          {"serialized_named_tensors": [serialize_named_tensors([(name, value.contiguous())])]})


def expected(state: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32) -> dict:
    return {k: (dtype_name(dtype), tensor_checksum(v, dtype)) for k, v in state.items()}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_weights_checker_agrees_with_the_trainer_side_checksum(tiny_model_dir, dtype):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    want = {n: tensor_checksum(p, getattr(torch, dtype)) for n, p in model.named_parameters()}
    with embedded_server(str(tiny_model_dir), ["--dtype", dtype]) as addr:
        body = _post(addr, "/weights_checker", {"action": "checksum"})
        (rank,) = body["ranks"]
        assert body["success"] and body["hash"] == "sha256-64"
        assert set(rank["dtypes"].values()) == {dtype}
        assert rank["checksums"] == want
        # one element changed by the smallest step its dtype has: a different checksum
        name = "model.norm.weight"
        p = dict(model.named_parameters())[name].detach().to(getattr(torch, dtype)).clone()
        p[3] = torch.nextafter(p[3], torch.tensor(2.0, dtype=p.dtype))
        corrupt(addr, name, p)
        got = _post(addr, "/weights_checker", {})["ranks"][0]["checksums"]
        assert got[name] != want[name] and got[name] == tensor_checksum(p)
        assert {k: v for k, v in got.items() if k != name} == {
            k: v for k, v in want.items() if k != name}


@pytest.fixture(scope="module")
def two_servers(tiny_model_dir):
    with embedded_server(str(tiny_model_dir), ["--weight-version", "0"]) as a, \
            embedded_server(str(tiny_model_dir), ["--weight-version", "0"]) as b:
        yield [a, b]


def test_corrupted_server_is_resynced_and_readmitted(two_servers, tiny_model_dir, tmp_path, caplog):
    eng = make_engine(two_servers, health_check_interval=0.2)
    try:
        state = perturbed_state(tiny_model_dir, seed=41)
        save_model(tiny_model_dir, state, tmp_path / "v1")
        meta = WeightUpdateMeta(type="disk", version=1, path=str(tmp_path / "v1"), verify=True)
        meta.checksums = expected(state)  # what the trainer publishes before the marker
        meta.write_disk_marker()
        bad = two_servers[1]
        real = eng.verifier.after_update

        async def corrupted_then_verified(session, report, m, on_disk):
            assert on_disk  # the disk update's folder: the re-sync reloads from it
            corrupt(bad, "model.norm.weight", state["model.norm.weight"] + 1e-3)
            await real(session, report, m, on_disk)

        eng.verifier.after_update = corrupted_then_verified
        with caplog.at_level(logging.WARNING):
            eng.update_weights(meta).result(60)
        assert "WEIGHT MISMATCH" in caplog.text and bad in caplog.text
        assert "re-synced to v1 and verified" in caplog.text
        assert eng.pool.healthy_addrs() == two_servers and not eng.verifier.quarantined
        got = _post(bad, "/weights_checker", {})["ranks"][0]["checksums"]
        assert got["model.norm.weight"] == meta.checksums["model.norm.weight"][1]
        out = run_all(eng, [request(f"after-{i}", 3) for i in range(4)])
        assert {r.output_versions[0] for r in out} == {1}
    finally:
        eng.destroy()


def test_persistent_mismatch_stops_the_run(two_servers, tiny_model_dir, tmp_path):
    eng = make_engine(two_servers)
    try:
        state = perturbed_state(tiny_model_dir, seed=42)
        save_model(tiny_model_dir, state, tmp_path / "v2")
        eng.set_version(1)
        meta = WeightUpdateMeta(type="disk", version=2, path=str(tmp_path / "v2"), verify=True)
        # the "trainer" sent other bytes than every server loads: no re-sync can fix that
        meta.checksums = expected({**state, "model.norm.weight": state["model.norm.weight"] * 2})
        meta.write_disk_marker()
        with pytest.raises(WeightVerificationError, match=r"still differ.*model\.norm\.weight"):
            eng.update_weights(meta).result(60)
        assert eng.get_version() == 1  # the version never moved to weights nobody verified
    finally:
        eng.destroy()
