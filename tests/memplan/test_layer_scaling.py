"""The planner's layer scaling: a deep model's plan from traces of 3 and 4 decoder layers
equals the full trace, to the byte, in every category."""

from __future__ import annotations

import pytest

from arealite.api.config.actor import MixedPrecisionConfig, PPOActorConfig
from arealite.memplan.layer_scaling import scalable, with_layers
from arealite.memplan.trainer_memory import predict_trainer

pytestmark = pytest.mark.long  # nine traces under fake tensors: minutes on a busy machine

# five identical layers under a 32,000-token vocabulary (the head's share is large)
SHAPE = dict(model_type="qwen2", vocab_size=32000, hidden_size=64, intermediate_size=128,
             num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=8192, tie_word_embeddings=True)
MOE = dict(SHAPE, model_type="qwen3_moe", vocab_size=4096, head_dim=16,
           moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
           tie_word_embeddings=False, mlp_only_layers=[], decoder_sparse_step=1)
BF16 = MixedPrecisionConfig(param_dtype="bfloat16", reduce_dtype="float32")


@pytest.mark.parametrize("shape,world,knobs", [
    (SHAPE, 1, {}),  # no FSDP: activations grow layer by layer, the peak at the head
    (SHAPE, 2, dict(gradient_checkpointing=True, logprob_head="fused")),  # per-layer gathers
    # the table's recipe on a mixture of experts: bf16 compute over fp32 weights, cp 2
    (MOE, 2, dict(gradient_checkpointing=True, logprob_head="fused", dtype="float32",
                  mixed_precision=BF16, context_parallel_size=2)),
], ids=["one-rank", "fsdp2-checkpointing-fused", "moe-bf16-cp2"])
def test_scaled_plan_equals_the_full_trace(shape, world, knobs):
    cfg = PPOActorConfig(path="unused", max_tokens_per_mb=840, attn_impl="segments",
                         shared_prompt_packing=False, **knobs)
    full = predict_trainer(cfg, shape, world, scale_layers=False)
    scaled = predict_trainer(cfg, shape, world)
    assert any("scaled to 5" in n for n in scaled.notes)
    assert not any("scaled" in n for n in full.notes)
    assert scaled.peak == full.peak
    assert scaled.breakdown == full.breakdown
    assert scaled.head_bytes == full.head_bytes


def test_only_identical_layers_deeper_than_the_traces_are_scaled():
    assert scalable(SHAPE)
    assert not scalable(with_layers(SHAPE, 4))  # no deeper than the traces: traced whole
    assert not scalable(dict(SHAPE, layer_types=["full_attention"] * 5 + ["sliding_attention"]))
    assert not scalable(dict(SHAPE, model_type="qwen3_moe", mlp_only_layers=[0]))
    assert not scalable(dict(SHAPE, model_type="qwen3_moe", decoder_sparse_step=2))
    cut = with_layers(dict(SHAPE, layer_types=["full_attention"] * 6), 3)
    assert cut["num_hidden_layers"] == 3 and cut["layer_types"] == ["full_attention"] * 3
