"""The whole client loop against two embedded servers: a workflow calling ``agenerate``,
``prepare_batch`` running ahead of a "trainer" that updates the weights from disk every step,
and ``rollout_batch`` in sync mode. Checks the trajectory contract and invariant 1."""

from __future__ import annotations

import contextlib
import shutil

import pytest
import torch

from arealite.api.config.dataset import DatasetConfig
from arealite.api.config.rollout import GenerationHyperparameters, InferenceEngineConfig
from arealite.api.io_struct import ModelRequest, WeightUpdateMeta
from arealite.api.trajectory import pad_sequences_to_tensors
from arealite.api.workflow_api import RolloutWorkflow
from arealite.dataset.loader import create_dataloader
from arealite.rollout.remote_engine import RemoteInferenceEngine
from tests.support.procs import embedded_server

pytestmark = pytest.mark.integration


class GenerateOnce(RolloutWorkflow):
    """One sample per prompt; reward = number of generated tokens (no reward model needed)."""

    def __init__(self, n: int):
        self.g = GenerationHyperparameters(max_new_tokens=n, ignore_eos=True)

    async def arun_episode(self, engine, data):
        r = await engine.agenerate(ModelRequest(input_ids=list(data["ids"]), gconfig=self.g))
        n_in = len(r.input_tokens)
        return pad_sequences_to_tensors([{
            "input_ids": r.input_tokens + r.output_tokens,
            "loss_mask": [0] * n_in + [1] * r.output_len,
            "logprobs": [0.0] * n_in + r.output_logprobs,
            "versions": [-1] * n_in + r.output_versions,
            "rewards": float(r.output_len),
        }])


@pytest.fixture(scope="module")
def two_servers(tiny_model_dir):
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(embedded_server(str(tiny_model_dir), ["--weight-version", "0"]))
               for _ in range(2)]


def test_prepare_batch_with_weight_updates_keeps_staleness(two_servers, tiny_model_dir, tmp_path):
    b, eta = 4, 1
    eng = RemoteInferenceEngine(InferenceEngineConfig(
        consumer_batch_size=b, max_head_offpolicyness=eta, max_concurrent_rollouts=8,
        setup_timeout=30, request_timeout=60, weight_update_timeout=60,
    ))
    eng.initialize(two_servers)
    try:
        rows = [{"ids": [3, 4, 5 + i % 50]} for i in range(40)]
        loader = create_dataloader(rows, DatasetConfig(batch_size=b, shuffle=True, drop_last=True))
        wf = GenerateOnce(n=24)
        weights = tmp_path / "weights"
        shutil.copytree(tiny_model_dir, weights)  # the shared fixture dir stays untouched
        for step in range(4):
            batch = eng.prepare_batch(loader, wf)
            assert batch["input_ids"].shape == (b, 3 + 24)
            assert batch["loss_mask"].sum().item() == b * 24
            gen_versions = batch["versions"][batch["loss_mask"]]
            assert (gen_versions >= 0).all() and (batch["versions"][~batch["loss_mask"]] == -1).all()
            assert eng.get_version() - gen_versions.min().item() <= eta  # invariant 1
            assert torch.isfinite(batch["logprobs"][batch["loss_mask"]]).all()
            meta = WeightUpdateMeta(type="disk", version=step + 1, path=str(weights))
            meta.write_disk_marker()  # same files, new version label: the path is what is tested
            eng.update_weights(meta).result(60)
            assert eng.get_version() == step + 1
        c = eng.executor.counters()
        assert c["failed"] == 0 and c["accepted"] >= 4 * b
    finally:
        eng.destroy()


def test_rollout_batch_sync_mode(two_servers):
    eng = RemoteInferenceEngine(InferenceEngineConfig(consumer_batch_size=3, setup_timeout=30))
    eng.initialize(two_servers)
    try:
        out = eng.rollout_batch([{"ids": [7, 8, i]} for i in range(3)], GenerateOnce(n=5))
        assert out["input_ids"].shape == (3, 8) and out["rewards"].tolist() == [5.0] * 3
        assert sorted(eng.pool.servers[a].served for a in two_servers) == [1, 2]
    finally:
        eng.destroy()
