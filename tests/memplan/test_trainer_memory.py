"""The planner's trainer prediction on small shapes: the knobs move the terms they should, and
(integration) the prediction is within 10% of the measured peak of the same real update."""

from __future__ import annotations

import pytest

from arealite.api.config.actor import PPOActorConfig
from arealite.memplan.trainer_memory import predict_trainer

# a 2-layer body under a 32,000-token vocabulary: the head's share is large, as at long context
SHAPE = dict(model_type="qwen2", vocab_size=32000, hidden_size=64, intermediate_size=128,
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=8192, tie_word_embeddings=True)
TOKENS = 1680


def _plan(world: int = 1, **knobs):
    cfg = PPOActorConfig(path="unused", max_tokens_per_mb=TOKENS, attn_impl="segments",
                         shared_prompt_packing=False, **knobs)
    return predict_trainer(cfg, SHAPE, world)


def test_fused_head_and_checkpointing_lower_the_terms_they_own():
    dense = _plan(logprob_head="dense")
    fused = _plan(logprob_head="fused")
    fused_gc = _plan(logprob_head="fused", gradient_checkpointing=True)
    # dense: fp32 logits [1680 x 32000] (205 MiB) and what follows from them
    assert dense.head_bytes >= TOKENS * 32000 * 4
    assert fused.peak < dense.peak - TOKENS * 32000 * 4
    assert fused_gc.breakdown["activations"] < fused.breakdown["activations"]
    # the weights are the same whatever the head: 2.1M parameters in fp32
    n = dense.breakdown["parameters"] / 4
    assert 2.0e6 < n < 2.3e6
    assert dense.breakdown["optimizer"] == pytest.approx(2 * dense.breakdown["parameters"],
                                                          rel=0.01)


def test_two_ranks_shard_the_optimizer_state():
    one, two = _plan(1), _plan(2)
    assert two.breakdown["optimizer"] == pytest.approx(one.breakdown["optimizer"] / 2, rel=0.02)
    assert two.world_size == 2


@pytest.mark.integration
def test_prediction_within_ten_percent_of_the_measured_update():
    from benchmarks.micro.memory_plan import in_subprocess, measure

    point = dict(model="tiny", world=1, cp=1, head="dense", tokens=TOKENS)
    predicted = in_subprocess("predict", point)["peak"]
    measured = measure(point, timeout=600)["peak"]
    assert abs(predicted / measured - 1) <= 0.10, (predicted, measured)
