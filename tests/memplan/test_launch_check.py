"""The launcher asks the planner before it starts anything: a GPU run predicted over its GPU's
memory is one line and exit 2 naming the knob that fits; with that knob set it is accepted.

The accepted launch would start servers and a CUDA trainer, which cannot run on these CPU
machines: ``LocalLauncher.run`` is replaced by a recorder there (the check runs before it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from arealite.api.config.loader import load_config
from arealite.launcher import local
from arealite.memplan.launch_check import applies
from arealite.memplan.model_shapes import write_config_dir
from tests.support.min_assets import min_assets

REPO = Path(__file__).resolve().parents[2]
GRPO = str(REPO / "configs" / "toy_grpo.yaml")
SHAPE = dict(model_type="qwen2", vocab_size=32000, hidden_size=64, intermediate_size=128,
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=8192, tie_word_embeddings=True)


@pytest.fixture
def gpu_run(tmp_path) -> list[str]:
    """A toy GRPO run on a CUDA device of 2 GiB: dense logits of 8,192 tokens over 32,000
    words (1 GiB in fp32, and their softmax and gradient) do not fit, the fused head does."""
    model = write_config_dir(SHAPE, tmp_path / "planned_model")
    return [GRPO, *min_assets(tmp_path), f"actor.path={model}", "device=cuda",
            "actor.logprob_head=dense", "actor.max_tokens_per_mb=8192", "launcher.gpu=2GiB"]


@pytest.fixture
def started(monkeypatch) -> list[bool]:
    runs: list[bool] = []

    def run(self) -> int:
        runs.append(True)
        return 0

    monkeypatch.setattr(local.LocalLauncher, "run", run)
    return runs


def test_refused_in_one_line_then_accepted_with_the_named_knob(capsys, gpu_run, started):
    assert local.main(gpu_run) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    assert err.startswith("arealite: memory error: actor.max_tokens_per_mb=8192 needs ")
    assert "per rank on 2GiB" in err and "launcher.memory_check=false" in err
    assert not started
    knob = re.search(r"set (\S+=\S+) \(predicted (\d+\.\d) GiB\)", err)
    assert knob, err
    assert knob.group(1) == "actor.logprob_head=fused"
    assert float(knob.group(2)) < 2 * 0.9

    assert local.main([*gpu_run, knob.group(1)]) == 0
    assert started == [True]
    err = capsys.readouterr().err
    assert "memory plan: trainer peak" in err and f"{knob.group(2)} GiB" in err


def test_the_check_is_off_with_one_flag(gpu_run, started):
    assert local.main([*gpu_run, "launcher.memory_check=false"]) == 0
    assert started == [True]


def test_cpu_runs_are_not_planned(gpu_run):
    cfg = load_config(GRPO, gpu_run[1:-4] + ["device=cpu"])
    assert not applies(cfg)
    assert applies(load_config(GRPO, gpu_run[1:]))
