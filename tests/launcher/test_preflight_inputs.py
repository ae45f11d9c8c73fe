"""The bad-input list of #37: each one is one line on stderr and exit 2 from ``--dry-run``
(the same check runs before a real launch), within seconds, before anything starts."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from arealite.launcher.local import main
from tests.support.min_assets import min_assets

REPO = Path(__file__).resolve().parents[2]
GRPO = str(REPO / "configs" / "toy_grpo.yaml")


@pytest.fixture
def assets(tmp_path) -> list[str]:
    return min_assets(tmp_path)


def _one_line(capsys, args: list[str]) -> str:
    t0 = time.monotonic()
    assert main(args + ["--dry-run"]) == 2
    assert time.monotonic() - t0 < 30  # seconds, on a loaded machine
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    return err


def test_the_good_inputs_pass(capsys, assets):
    assert main([GRPO, *assets, "--dry-run"]) == 0
    assert "run folder" in capsys.readouterr().out


def test_a_missing_dataset_file(capsys, assets, tmp_path):
    err = _one_line(capsys, [GRPO, *assets, f"train_dataset.path={tmp_path / 'nope.jsonl'}"])
    assert "train_dataset.path: dataset file not found" in err and "nope.jsonl" in err


def test_a_malformed_jsonl_line_is_named_by_file_and_line(capsys, assets, tmp_path):
    bad = tmp_path / "bad.jsonl"
    good = json.dumps({"question": "1 + 1 =", "answer": "#### 2"})
    bad.write_text(f"{good}\n\n{good}\n{{\"question\": oops}}\n")
    err = _one_line(capsys, [GRPO, *assets, f"valid_dataset.path={bad}"])
    assert f"{bad}:4: not valid JSON" in err


def test_a_reward_that_does_not_exist(capsys, assets):
    err = _one_line(capsys, [GRPO, *assets, "workflow.reward_fn=workflows.rewards.toy:no_such"])
    assert "workflow.reward_fn" in err and "no_such" in err


def test_rows_missing_the_field_the_reward_needs(capsys, assets, tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"question": "1 + 1 ="}) + "\n")
    err = _one_line(capsys, [GRPO, *assets, f"train_dataset.path={rows}"])
    assert f"on the row at {rows}:1" in err and "toy_reward" in err


def _user_reward(tmp_path: Path, monkeypatch, body: str, name: str) -> str:
    (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return f"workflow.reward_fn={name}:r"


def test_a_reward_with_the_wrong_signature(capsys, assets, tmp_path, monkeypatch):
    key = _user_reward(tmp_path, monkeypatch, "def r(completion):\n    return 1.0\n",
                       "reward_sig")
    err = _one_line(capsys, [GRPO, *assets, key])
    assert "TypeError" in err and "reward_sig:r" in err


def test_a_reward_returning_a_string(capsys, assets, tmp_path, monkeypatch):
    key = _user_reward(tmp_path, monkeypatch, "def r(*a, **k):\n    return '1.0'\n",
                       "reward_str")
    err = _one_line(capsys, [GRPO, *assets, key])
    assert "returned str '1.0', not a number" in err


def test_an_eval_fn_that_does_not_exist_or_takes_the_wrong_arguments(capsys, assets, tmp_path,
                                                                     monkeypatch):
    (tmp_path / "preflight_eval.py").write_text("def ev(rows):\n    return {}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    err = _one_line(capsys, [GRPO, *assets, "evaluator.eval_fn=preflight_eval:nope"])
    assert "evaluator.eval_fn" in err and "nope" in err
    err = _one_line(capsys, [GRPO, *assets, "evaluator.eval_fn=preflight_eval:ev"])
    assert "must accept (engine, rows)" in err


def test_max_new_tokens_above_the_context(capsys, assets):
    err = _one_line(capsys, [GRPO, *assets, "gconfig.max_new_tokens=4096"])
    assert "gconfig.max_new_tokens=4096 does not fit" in err and "512" in err


def test_a_model_path_without_a_model(capsys, assets, tmp_path):
    err = _one_line(capsys, [GRPO, *assets, f"actor.path={tmp_path / 'missing'}"])
    assert "actor.path=" in err and "no such folder" in err
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "base"}))
    err = _one_line(capsys, [GRPO, *assets, f"actor.path={adapter}"])
    assert "holds a LoRA adapter alone" in err and "(base)" in err


def test_a_busy_master_port(capsys, assets):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        err = _one_line(capsys, [GRPO, *assets, f"weight_update.master_port={port}"])
    assert f"weight_update.master_port: port {port} is already in use" in err


def test_sft_rows_without_the_completion_key(capsys, tmp_path):
    sft = str(REPO / "configs" / "toy_sft.yaml")
    err = _one_line(capsys, [sft, *min_assets(tmp_path, "model.path"), "completion_key=target"])
    assert "has no field 'target'" in err
