"""The FSDP engine on the tiny MoE model: a saved checkpoint loads with transformers and
computes what the trainer does; a LoRA run puts its adapters on attention and trains, with
routing replay on."""

from __future__ import annotations

import json

import torch
from transformers import AutoModelForCausalLM

from arealite.api.config.actor import LoRAConfig
from arealite.api.io_struct import SaveLoadMeta
from arealite.engine.fsdp_engine import FSDPEngine
from arealite.engine.functional import gather_logprobs
from tests.support.fsdp_helpers import engine_config, random_trajectories


def _loss(logits, packed):  # logits, or the fused head's HeadInput (the default)
    return -gather_logprobs(logits, packed["labels"]).mean()


def test_moe_checkpoint_loads_with_transformers_and_lora_trains_attention(tiny_moe_dir, tmp_path):
    batch = random_trajectories(4, vocab=300)
    e = FSDPEngine(
        engine_config(tiny_moe_dir, routing_replay=True, max_tokens_per_mb=512),
        device="cpu",
        backend="gloo",
    )
    e.initialize()
    e.train_batch(batch, _loss, lambda p: 1.0)
    assert e.routing.take_stats()["moe/max_load/layer1"] >= 1.0
    e.save(SaveLoadMeta(path=str(tmp_path / "full"), weight_format="hf"))
    ids = batch["input_ids"][:1, :8]
    e.routing.replay(None)
    with torch.no_grad():
        ours = e.model(input_ids=ids).logits
        theirs = AutoModelForCausalLM.from_pretrained(str(tmp_path / "full"))(input_ids=ids).logits
    assert torch.allclose(ours, theirs, atol=1e-5)
    e.destroy()

    lora = FSDPEngine(
        engine_config(
            tiny_moe_dir,
            routing_replay=True,
            max_tokens_per_mb=512,
            lora=LoRAConfig(init_lora_weights=False),
        ),
        device="cpu",
        backend="gloo",
    )
    lora.initialize()
    before = {n: p.detach().clone() for n, p in lora.model.named_parameters() if p.requires_grad}
    lora.train_batch(batch, _loss, lambda p: 1.0)
    after = dict(lora.model.named_parameters())
    assert before and all(not torch.equal(before[n], after[n]) for n in before)
    lora.save(SaveLoadMeta(path=str(tmp_path / "adapter"), weight_format="hf"))
    cfg = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert sorted(cfg["target_modules"]) == [
        "k_proj",
        "o_proj",
        "q_proj",
        "v_proj",
    ]  # experts are 3-D
    lora.destroy()
