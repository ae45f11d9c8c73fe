"""``arealite plan CONFIG``: the plan printed, exit 0 when it fits, 1 with the knobs when it
does not, 2 on bad input."""

from __future__ import annotations

import json
from pathlib import Path

from arealite.cli.main import main as arealite
from arealite.memplan.model_shapes import write_config_dir
from tests.support.min_assets import min_assets

REPO = Path(__file__).resolve().parents[2]
GRPO = str(REPO / "configs" / "toy_grpo.yaml")
SHAPE = dict(model_type="qwen2", vocab_size=1000, hidden_size=64, intermediate_size=128,
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=4096, tie_word_embeddings=True)


def test_plan_prints_the_breakdown_and_writes_json(capsys, tmp_path):
    model = write_config_dir(SHAPE, tmp_path / "planned_model")
    out = tmp_path / "plan.json"
    args = ["plan", GRPO, *min_assets(tmp_path), f"actor.path={model}",
            "actor.max_tokens_per_mb=1680", "--gpu", "A100-40GB", "--json", str(out)]
    assert arealite(args) == 0
    text = capsys.readouterr().out
    assert "memory plan on A100-40GB" in text and "verdict: fits" in text
    assert "trainer (actor), per rank of 1, micro-batches of 1680 tokens" in text
    assert "server, each:" in text
    plan = json.loads(out.read_text())
    assert plan["fits"] and plan["trainer"]["peak"] == sum(plan["trainer"]["breakdown"].values())
    # over a device this small it does not fit: exit 1 with the knobs' line
    assert arealite([*args[:-4], "--gpu", "0.01GiB", "--no-knobs"]) == 1
    assert "does NOT fit" in capsys.readouterr().out


def test_an_unknown_gpu_is_one_line_and_exit_2(capsys, tmp_path):
    assert arealite(["plan", GRPO, *min_assets(tmp_path), "--gpu", "Z9000"]) == 2
    assert "unknown GPU 'Z9000'" in capsys.readouterr().err
