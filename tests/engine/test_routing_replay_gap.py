"""The proof of routing replay (``benchmarks/studies/routing_replay.py`` at test size): the
engine samples, the client's wire path carries the routed experts, the fp32 trainer recomputes.

- server bf16, trainer fp32 (the mismatch every deployment has): with replay the MoE model's
  per-token log-prob gap is as small as the dense model's under the same mismatch;
- server routers perturbed (fp32 both sides): the routers disagree on some tokens, and replay
  cuts the gap several-fold (the rest is the perturbed gate weights, which replay keeps).
"""

from __future__ import annotations

import pytest

from benchmarks.studies.routing_replay import gap_figures, toy_prompts


@pytest.fixture(scope="module")
def prompts(tiny_model_dir):
    return toy_prompts(tiny_model_dir, 6, seed=0)


def test_bf16_server_with_replay_is_as_close_as_the_dense_model(
    tiny_model_dir, tiny_moe_dir, prompts
):
    f = gap_figures(tiny_model_dir, tiny_moe_dir, prompts, 8, server_dtype="bfloat16")
    assert f["dense"]["tokens"] == f["moe_replay"]["tokens"] == 48
    assert 0 < f["dense"]["mean"] < 0.01  # bf16 against fp32: a real, small gap
    assert f["moe_replay"]["mean"] <= 2 * f["dense"]["mean"], f
    assert f["moe_no_replay"]["mean"] >= f["moe_replay"]["mean"] * 0.999, f
    assert f["routing_agreement"] is not None and f["routing_agreement"] > 0.9


def test_perturbed_server_routers_replay_cuts_the_gap(tiny_moe_dir, prompts):
    f = gap_figures(None, tiny_moe_dir, prompts, 8, server_dtype="float32", router_noise=0.1)
    assert f["routing_agreement"] < 1.0, f  # some tokens routed elsewhere by the server
    assert f["moe_no_replay"]["mean"] >= 5 * f["moe_replay"]["mean"], f
