from types import SimpleNamespace

from arealite.memplan.model_shapes import shape_config
from arealite.memplan.server_memory import (
    count_parameters,
    kv_bytes_per_token,
    predict_server,
    server_demand,
)


def _kv_reference(cfg: dict, dtype_bytes: int, tp: int, seqs: int, context: int) -> int:
    """One K and one V vector per token, layer and KV head held by this tensor-parallel rank."""
    heads_here = -(-cfg["num_key_value_heads"] // tp)
    total = 0
    for _ in range(seqs):
        for _ in range(cfg["num_hidden_layers"]):
            for _ in range(heads_here):
                total += 2 * cfg["head_dim"] * dtype_bytes * context
    return total


def test_kv_cache_formula_matches_the_loop():
    cfg = shape_config("qwen3-8b")
    for tp in (1, 2, 16):
        got = predict_server(cfg, 0, "bfloat16", 3, 1000, tp).breakdown["kv_cache"]
        assert got == _kv_reference(cfg, 2, tp, 3, 1000)
    # Qwen3-8B: 36 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 144 KiB per token
    assert kv_bytes_per_token(cfg, 2) == 147456


def test_parameter_count_from_the_config_alone():
    # Qwen3-0.6B's published size: 0.6B with tied embeddings (596,049,920 parameters)
    assert count_parameters(shape_config("qwen3-0.6b")) == 596049920


def test_sequences_in_flight_per_server():
    config = SimpleNamespace(
        rollout=SimpleNamespace(max_concurrent_rollouts=32, consumer_batch_size=16),
        gconfig=SimpleNamespace(n_samples=8, max_new_tokens=3000),
        servers=SimpleNamespace(max_running_requests=None, context_length=None),
        launcher=SimpleNamespace(n_servers=4))
    assert server_demand(config, shape_config("qwen3-0.6b")) == (64, 4024)
    config.servers.max_running_requests = 10
    config.servers.context_length = 8192
    assert server_demand(config, shape_config("qwen3-0.6b")) == (10, 8192)


def test_a_server_needs_one_sequence_and_queues_the_rest():
    cfg = shape_config("qwen3-0.6b")
    s = predict_server(cfg, 596049920, "bfloat16", 256, 32768)
    per_seq = kv_bytes_per_token(cfg, 2) * 32768 + 151936 * 4
    assert s.minimum == 596049920 * 2 + per_seq
    assert s.peak == 596049920 * 2 + 256 * per_seq
    usable = 72 * 2**30
    assert s.concurrent(usable) == (usable - 596049920 * 2) // per_seq
