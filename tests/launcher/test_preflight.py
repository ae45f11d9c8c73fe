"""A missing entry (or workflow/reward/eval) module is one line and exit 2 before anything
starts (#28), instead of torchrun's ChildFailedError traceback."""

from __future__ import annotations

import pytest

from arealite.launcher.local import main

CONFIG = ("kind: grpo\nactor:\n  path: model\nlauncher:\n  entry_module: my_train\n"
          "workflow:\n  path: workflows.rlvr:RLVRWorkflow\n")


@pytest.fixture
def user_folder(tmp_path):
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "task.yaml").write_text(CONFIG)
    return tmp_path / "cfg"


def test_missing_entry_module_is_one_line_with_the_fix(user_folder, monkeypatch, capsys):
    monkeypatch.chdir(user_folder)
    assert main(["task.yaml"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "launcher.entry_module: module 'my_train' is not importable" in err
    assert "PYTHONPATH" in err


def test_module_beside_the_config_names_that_folder(user_folder, monkeypatch, capsys):
    (user_folder / "my_train.py").write_text("")
    monkeypatch.chdir(user_folder.parent)
    assert main(["cfg/task.yaml", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"run from {user_folder}" in err


def test_reward_module_is_checked_too(user_folder, monkeypatch, capsys):
    (user_folder / "my_train.py").write_text("")
    monkeypatch.chdir(user_folder)
    assert main(["task.yaml", "workflow.reward_fn=my_reward:r", "--dry-run"]) == 2
    assert "workflow.reward_fn: module 'my_reward'" in capsys.readouterr().err
    (user_folder / "my_reward.py").write_text("def r(*a, **k):\n    return 0.0\n")
    assert main(["task.yaml", "workflow.reward_fn=my_reward:r", "--dry-run"]) == 0


def test_a_run_without_a_workflow_path_is_one_line(user_folder, monkeypatch, capsys):
    """No default names a workflow (the API names no layer above it): the config must."""
    monkeypatch.chdir(user_folder)
    assert main(["task.yaml", "workflow.path=", "launcher.entry_module=null", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "workflow.path is not set" in err


@pytest.mark.parametrize("overrides, fragment", [
    (["actor.context_parallel_size=2", "launcher.trainer_nproc=3"],
     "actor.context_parallel_size=2 does not divide launcher.trainer_nproc=3"),
    (["actor.context_parallel_size=3", "launcher.trainer_nproc=3"],
     "actor.context_parallel_size=3 does not divide the model's 4 attention heads"),
    (["actor.context_parallel_size=2", "actor.attn_impl=sdpa"], "needs attn_impl auto or segments"),
])
def test_bad_context_parallel_size_is_one_line(tmp_path, monkeypatch, capsys, overrides, fragment):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text('{"num_attention_heads": 4}')
    (tmp_path / "task.yaml").write_text(
        "kind: grpo\nactor:\n  path: model\n  shared_prompt_packing: false\n"
        "workflow:\n  path: workflows.rlvr:RLVRWorkflow\n")
    monkeypatch.chdir(tmp_path)
    assert main(["task.yaml", *overrides, "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and fragment in err, err
