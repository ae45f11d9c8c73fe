"""The planner plans mixture-of-experts models without routing values (fake tensors have
none). What makes that a prediction for any routing: the experts' memory does not depend on
where the tokens go. Checked here on real tensors: one MoE block's experts, forward and
backward, with tokens spread over all experts and with every token sent to the same top-k."""

from __future__ import annotations

import pytest
import torch

from arealite.memplan.live_bytes import LiveBytes

TOKENS, EXPERTS, TOP_K, HIDDEN = 1024, 16, 4, 64


def _experts(implementation: str) -> torch.nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model("qwen3_moe", vocab_size=256, hidden_size=HIDDEN,
                               intermediate_size=128, moe_intermediate_size=32,
                               num_hidden_layers=1, num_attention_heads=4,
                               num_key_value_heads=2, head_dim=16, num_experts=EXPERTS,
                               num_experts_per_tok=TOP_K)
    model = AutoModelForCausalLM.from_config(cfg)
    model.set_experts_implementation(implementation)
    return model.model.layers[0].mlp.experts


def _peak(experts: torch.nn.Module, index: torch.Tensor) -> int:
    hidden = torch.randn(TOKENS, HIDDEN, requires_grad=True)
    weights = torch.rand(TOKENS, TOP_K, requires_grad=True)
    with LiveBytes() as lb:
        experts(hidden, index, weights).sum().backward()
    return lb.peak


@pytest.mark.parametrize("implementation,slack", [
    ("grouped_mm", 0),  # transformers' default: [tokens x top_k] rows whatever the routing
    ("eager", 256),  # a loop over the experts hit: their index list differs by a few bytes
])
def test_expert_memory_does_not_depend_on_the_routing(implementation, slack):
    experts = _experts(implementation)
    g = torch.Generator().manual_seed(0)
    spread = torch.stack([torch.randperm(EXPERTS, generator=g)[:TOP_K] for _ in range(TOKENS)])
    same = torch.arange(TOP_K).expand(TOKENS, TOP_K).contiguous()
    a, b = _peak(experts, spread), _peak(experts, same)
    assert a > TOKENS * TOP_K * HIDDEN * 4  # the routed rows are in the count
    assert abs(a - b) <= slack, (a, b)
