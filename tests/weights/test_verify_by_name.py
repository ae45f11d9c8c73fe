"""Comparing /get_weights_by_name answers with the trainer's tensors."""

import torch

from arealite.weights.verify_by_name import weight_mismatches


def test_weight_mismatches_reports_each_server():
    w = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    ok = w.tolist()
    off = (w + 1e-3).tolist()
    fetched = {"a:1": ok, "b:2": off, "c:3": ok[:2]}
    bad = weight_mismatches("w", w, fetched, truncate_size=100, atol=1e-5)
    assert len(bad) == 2
    assert bad[0].startswith("b:2 w: max diff 0.001")
    assert bad[1] == "c:3 w: shape (2, 3) != (4, 3)"
    # truncated like the endpoint: only the first rows are compared
    assert weight_mismatches("w", w, {"a:1": ok[:2]}, truncate_size=2, atol=0) == []
    assert weight_mismatches("b", torch.ones(3, dtype=torch.bfloat16), {"a:1": [1.0, 1.0, 1.0]}, 100, 0) == []
