"""What a model path holds (#37): an adapter-only folder is never loaded as a full model."""

from __future__ import annotations

import json

from arealite.utils.model_dir import is_hub_id, model_dir_problem


def test_a_full_model_an_adapter_alone_and_nothing(tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    (full / "config.json").write_text("{}")
    assert model_dir_problem(str(full), "actor.path") is None
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "/b"}))
    msg = model_dir_problem(str(adapter), "actor.path")
    assert msg is not None and "LoRA adapter alone" in msg and "(/b)" in msg
    (full / "adapter_config.json").write_text("{}")  # an adapter saved into a model's folder
    assert "both a full model and a LoRA adapter" in model_dir_problem(str(full), "model.path")
    assert "no config.json" in model_dir_problem(str(tmp_path), "actor.path")
    missing = model_dir_problem(str(tmp_path / "sft_model"), "actor.path")
    assert "no such folder" in missing and "`make run` builds" in missing
    # #37: never "build a tiny model at that path": an untrained model at the main job's
    # warm-start folder would be taken by `make run` as its trained warm start
    assert f"--out {tmp_path / 'sft_model'}" not in missing


def test_hub_ids_are_left_to_their_library(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert is_hub_id("Qwen/Qwen2.5-1.5B-Instruct")
    assert model_dir_problem("Qwen/Qwen2.5-1.5B-Instruct", "actor.path") is None
    (tmp_path / "outputs").mkdir()
    assert not is_hub_id("outputs/assets")  # a local folder's child, missing: a local path
    assert not is_hub_id("./a/b") and not is_hub_id("/a")
