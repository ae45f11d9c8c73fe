"""The long-context benchmark's smoke form: both heads run one PPO update on the model with
Qwen's vocabulary, the rows, the table and the results file come out."""

from __future__ import annotations

import json

from benchmarks.micro import long_context as lc


def test_smoke_writes_rows_and_table(tmp_path, capsys):
    out = tmp_path / "lc.json"
    assert (
        lc.main(
            [
                "--budgets",
                "64",
                "--seq-len",
                "32",
                "--chunk",
                "16",
                "--ckpt",
                "0",
                "--updates",
                "1",
                "--in-process",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    run = json.loads(out.read_text())
    assert {r["head"] for r in run["rows"]} == {"dense", "fused"}
    assert all(
        r["tokens"] == 64 and r["rows"] == 2 and r["tokens_per_s"] > 0 and r["peak"] >= 0
        for r in run["rows"]
    )
    text = capsys.readouterr().out
    assert "fused/dense peak" in text and "MiB RSS growth" in text


def test_trace_batch_fills_the_budget_and_flops_formula():
    b = lc.trace_batch(1000, 300, 500)
    assert b["attention_mask"].sum(1).tolist() == [300, 300, 300, 100]
    cfg = type(
        "C",
        (),
        {"hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": 3, "head_dim": None},
    )()
    assert lc.model_flops(cfg, 100, [2, 3]) == 6 * 100 * 5 + 3 * 6 * (4 + 9) * 2 * 4
