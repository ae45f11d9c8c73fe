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


def _row(budget, head, cp, peak, secs, rank=0):
    return {
        "budget": budget,
        "head": head,
        "ckpt": False,
        "cp": cp,
        "rank": rank,
        "tokens": 100,
        "seconds": secs,
        "tokens_per_s": 100 / secs,
        "peak": peak,
        "flops": 1.0,
        "peak_unit": "MiB RSS growth",
    }


def test_cp_group_point_and_ratios():
    # a cp group's point: the slowest rank's seconds, the largest rank's peak, every peak kept
    g = lc._combine([_row(64, "dense", 2, 30.0, 1.0, 0), _row(64, "dense", 2, 40.0, 2.0, 1)])
    assert (g["seconds"], g["peak"], g["peaks"], g["tokens_per_s"]) == (2.0, 40.0, [30.0, 40.0], 50)
    text = lc.table([_row(64, "dense", 1, 100.0, 1.0), g], None)
    assert "64 ckpt=0 dense: cp=2/cp=1 per-rank peak 0.400, tokens/s 0.50" in text


def test_cp_bad_input_is_one_line_exit_2(capsys):
    # every rank of a cp group needs a row of its own: one trace cannot feed two ranks
    assert lc.main(["--budgets", "64", "--seq-len", "0", "--cp", "1,2"]) == 2
    assert lc.main(["--budgets", "64", "--seq-len", "32", "--cp", "2", "--in-process"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "--cp 2 needs at least 2 rows" in err[0] and "--in-process" in err[1]
