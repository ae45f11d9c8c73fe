"""VisionRLVRWorkflow end to end on CPU: the real client against an embedded server on the tiny
Qwen2-VL, trajectories with their images, and the FSDP trainer's recomputed logprobs for them
equal to the server's (fp32) through the packed, multi-image micro-batches."""

from __future__ import annotations

import json

import pytest
import torch

from arealite.api.config import GenerationHyperparameters, InferenceEngineConfig
from arealite.api.io_struct import FinetuneSpec
from arealite.engine.fsdp_engine import FSDPEngine
from arealite.models.tiny_vl import load_processor
from tests.engine.fsdp_helpers import engine_config
from tests.procs import embedded_server
from workflows.rewards.counting import counting_reward
from workflows.vision import VisionRLVRWorkflow

pytestmark = pytest.mark.integration


def test_counting_reward():
    assert counting_reward("", "3", answer="3") == 1.0
    assert counting_reward("", "There are 2.", answer="3") == 0.0
    assert counting_reward("", "none", answer="0") == 0.0


@pytest.fixture(scope="module")
def rollout(tiny_vl_model_dir):
    from arealite.rollout.remote_engine import RemoteSGLangEngine

    args = ["--dtype", "float32", "--random-seed", "0", "--log-level", "warning"]
    with embedded_server(str(tiny_vl_model_dir), args) as addr:
        eng = RemoteSGLangEngine(InferenceEngineConfig(consumer_batch_size=3, request_timeout=120,
                                                       setup_timeout=60))
        eng.initialize(addr)
        try:
            yield eng
        finally:
            eng.destroy()


@pytest.fixture(scope="module")
def batch_and_processor(rollout, tiny_vl_model_dir, toy_vision_dir):
    rows = [json.loads(x) for x in (toy_vision_dir / "valid.jsonl").read_text().splitlines()][:3]
    processor = load_processor(tiny_vl_model_dir)
    g = GenerationHyperparameters(n_samples=2, max_new_tokens=6, temperature=1.0)
    wf = VisionRLVRWorkflow(counting_reward, g, processor)
    return rollout.rollout_batch([dict(r) for r in rows], wf), processor


def test_trajectories_carry_images(batch_and_processor):
    batch, processor = batch_and_processor
    B = batch["input_ids"].shape[0]
    # a 32x32 scene: 4x4 patches of 8 pixels (D = 3 x 2 x 8 x 8 = 384), 2x2 tokens after the merge
    assert B == 6 and batch["pixel_values"].shape == (B, 16 * 384)
    assert batch["image_grid_thw"].tolist() == [[1, 4, 4]] * B
    image_id = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert torch.equal(batch["image_token_mask"], batch["input_ids"] == image_id)
    assert batch["image_token_mask"].sum(1).tolist() == [4] * B
    assert set(batch["rewards"].tolist()) <= {0.0, 1.0}


@pytest.mark.parametrize("attn", ["segments", "sdpa"])
def test_trainer_logprobs_equal_the_servers(batch_and_processor, tiny_vl_model_dir, attn):
    batch, _ = batch_and_processor
    # 80 tokens per micro-batch: rows of different prompts (and images) share micro-batches
    eng = FSDPEngine(engine_config(tiny_vl_model_dir, attn_impl=attn, max_tokens_per_mb=80,
                                   optimizer=None), device="cpu", backend="gloo")
    eng.initialize(ft_spec=FinetuneSpec(total_train_epochs=1, dataset_size=4, train_batch_size=2))
    try:
        assert len(eng.split_micro_batches(batch)) < batch["input_ids"].shape[0]
        logp = eng.forward(batch)
    finally:
        eng.destroy()
    mask = batch["loss_mask"]
    assert int(mask.sum()) > 0
    diff = (logp - batch["logprobs"])[mask].abs().max().item()
    assert diff < 1e-5, diff
