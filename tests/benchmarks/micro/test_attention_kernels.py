"""The attention-kernel benchmark runs end to end on CPU (the GPU path is the same code with
``--device cuda``), its FLOP count is the formula's, and the kept GPU runs render a section."""

from __future__ import annotations

import json
from types import SimpleNamespace

from benchmarks.micro import attention_kernels as ak


def test_model_flops_formula():
    cfg = SimpleNamespace(hidden_size=8, num_attention_heads=2, num_hidden_layers=3)
    # 6 N per token, plus 6 L^2 H d per layer and sequence (d = 8 / 2)
    assert ak.model_flops(cfg, 100, [2, 3]) == 6 * 100 * 5 + 3 * 6 * (4 + 9) * 2 * 4


def test_cpu_run_writes_rows(tmp_path):
    out = tmp_path / "r.json"
    assert ak.main(["--device", "cpu", "--model", "tiny", "--mix", "toy", "--groups", "2",
                    "--group-size", "4", "--rounds", "1", "--budgets", "4096",
                    "--kernels", "dense,segments,flex,floor", "--json", str(out)]) == 0
    run = json.loads(out.read_text())
    got = {(r["kernel"], r["shared"]) for r in run["rows"]}
    # flex needs CUDA: left out on CPU; segments runs with and without shared prompts
    assert got == {("dense", False), ("segments", False), ("segments", True), ("floor", False)}
    assert all(r["tokens_per_s"] > 0 and r["tokens"] == run["batch"]["tokens"] for r in run["rows"])


def test_page_section_renders_kept_runs():
    text = ak.page_section()
    assert text is not None and "Tokens/s against the dense mask" in text
    runs = json.loads(ak.RESULT.read_text())
    assert text.count("| FlexAttention block mask (`flex`) |") == sum(
        r["kernel"] == "flex" for run in runs for r in run["rows"])
