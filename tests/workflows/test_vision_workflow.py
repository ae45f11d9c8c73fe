"""VisionRLVRWorkflow end to end on CPU: the real client against an embedded server on the tiny
Qwen2-VL, trajectories with their images, and the FSDP trainer's recomputed logprobs for them
equal to the server's (fp32) through the packed, multi-image micro-batches."""

from __future__ import annotations

import json

import pytest
import torch

from arealite.api.config.rollout import GenerationHyperparameters, InferenceEngineConfig
from arealite.api.io_struct import FinetuneSpec
from arealite.engine.fsdp_engine import FSDPEngine
from arealite.engine.vision_processor import load_processor
from tests.support.fsdp_helpers import engine_config
from tests.support.procs import embedded_server
from workflows.rewards.counting import counting_reward
from workflows.vision import VisionRLVRWorkflow

pytestmark = pytest.mark.integration


def test_counting_reward():
    assert counting_reward("", "3", answer="3") == 1.0
    assert counting_reward("", "There are 2.", answer="3") == 0.0
    assert counting_reward("", "none", answer="0") == 0.0


@pytest.fixture(scope="module")
def rollout(tiny_vl_model_dir):
    from arealite.rollout.remote_engine import RemoteInferenceEngine

    args = ["--dtype", "float32", "--random-seed", "0", "--log-level", "warning"]
    with embedded_server(str(tiny_vl_model_dir), args) as addr:
        eng = RemoteInferenceEngine(InferenceEngineConfig(consumer_batch_size=3, request_timeout=120,
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


def _reference_logprobs_with_prompt_images(model_dir, batch) -> torch.Tensor:
    """Each row alone through transformers, the image features placed by hand on the prompt's
    image tokens only (``image_token_mask``) and the rope positions computed from that mask."""
    from transformers import Qwen2VLForConditionalGeneration

    model = Qwen2VLForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = torch.zeros(batch["input_ids"].shape)
    with torch.no_grad():
        for b in range(batch["input_ids"].shape[0]):
            n = int(batch["attention_mask"][b].sum())
            ids = batch["input_ids"][b, :n][None]
            mask = batch["image_token_mask"][b, :n][None]
            grid = batch["image_grid_thw"][b].view(-1, 3)
            pixels = batch["pixel_values"][b].view(int(grid.prod(-1).sum()), -1)
            embeds = model.get_input_embeddings()(ids)
            feats = torch.cat(model.model.get_image_features(pixels, grid).pooler_output)
            embeds[mask] = feats
            pos, _ = model.model.get_rope_index(ids, mask.int(), image_grid_thw=grid)
            logits = model(inputs_embeds=embeds, position_ids=pos).logits[0].float()
            logp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
            out[b, 1:n] = logp
    return out


def test_a_completion_that_samples_the_image_token_is_text(batch_and_processor, tiny_vl_model_dir):
    """A sampled ``<|image_pad|>`` in a completion is an ordinary token, as it is to the server:
    the image mask keeps to the prompt, and the trainer's packed forward (several rows' images in
    one micro-batch) gives the same logprobs as a per-row reference with the images placed by
    hand (transformers alone would count the completion's token as an image placeholder)."""
    batch, processor = batch_and_processor
    image_id = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    batch = {k: v.clone() for k, v in batch.items()}
    # rows 0 and 3: their first generated token becomes the image token id
    for b in (0, 3):
        first = int(batch["loss_mask"][b].nonzero()[0])
        batch["input_ids"][b, first] = image_id
    from arealite.api.vision_io import image_keys
    encs = [{"pixel_values": batch["pixel_values"][b][None], "image_grid_thw":
             batch["image_grid_thw"][b][None],
             "input_ids": torch.zeros(1, int(batch["loss_mask"][b].nonzero()[0]))}
            for b in range(batch["input_ids"].shape[0])]
    keys = image_keys(encs, image_id, batch["input_ids"])
    assert torch.equal(keys["image_token_mask"], batch["image_token_mask"])
    assert int((batch["input_ids"] == image_id).sum()) == int(batch["image_token_mask"].sum()) + 2
    eng = FSDPEngine(engine_config(tiny_vl_model_dir, attn_impl="segments", max_tokens_per_mb=80,
                                   optimizer=None), device="cpu", backend="gloo")
    eng.initialize(ft_spec=FinetuneSpec(total_train_epochs=1, dataset_size=4, train_batch_size=2))
    try:
        logp = eng.forward(batch)
    finally:
        eng.destroy()
    ref = _reference_logprobs_with_prompt_images(str(tiny_vl_model_dir), batch)
    mask = batch["loss_mask"].bool()
    assert (logp - ref)[mask].abs().max().item() < 1e-5
