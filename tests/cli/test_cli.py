import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).parents[2]


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "arealite.cli.main", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )


def test_config_dry_run_prints_resolved_yaml():
    r = run_cli("config", "configs/toy_grpo.yaml", "actor.optimizer.lr=0.001", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load(r.stdout)["actor"]["optimizer"]["lr"] == 0.001


def test_unknown_key_exits_2_without_traceback():
    r = run_cli("config", "configs/toy_grpo.yaml", "actor.no_such_key=1")
    assert r.returncode == 2
    assert "actor.no_such_key" in r.stderr and "Traceback" not in r.stderr


def test_wrongly_typed_overrides_exit_2_in_one_line():
    from arealite.api.config.loader import ConfigError, load_config

    for override in ("kind=[1]", "kind={a: 1}", "rollout=[1]", "actor.optimizer.lr=[1,2]",
                     "workflow.kwargs=[1]", "total_train_steps={a: 1}"):
        try:
            load_config(ROOT / "configs/toy_grpo.yaml", [override])
        except ConfigError as e:
            assert "\n" not in str(e), override
        else:
            raise AssertionError(f"{override} was accepted")
    r = run_cli("config", "configs/toy_grpo.yaml", "kind=[1]")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0 and "unknown kind" in r.stderr


def test_missing_file_exits_2():
    r = run_cli("config", "configs/nope.yaml")
    assert r.returncode == 2 and "not found" in r.stderr


def test_tiny_model_command(tmp_path):
    r = run_cli("tiny-model", "--out", str(tmp_path / "m"), "--seed", "1")
    assert r.returncode == 0, r.stderr
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tmp_path / "m")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    out = model.generate(tok("What is 1 + 1?", return_tensors="pt").input_ids, max_new_tokens=3)
    assert out.shape[1] >= 3


def test_toy_data_command(tmp_path):
    r = run_cli("toy-data", "--out", str(tmp_path), "--n-train", "10", "--n-valid", "5")
    assert r.returncode == 0, r.stderr
    assert len((tmp_path / "train.jsonl").read_text().splitlines()) == 10


def test_asset_commands_never_write_over_an_asset(tmp_path, capsys):
    """#37: assets are written once; another toy-data (or tiny-model) into the same folder is
    refused in one line, exit 2, and changes nothing; --overwrite replaces it."""
    from arealite.cli.main import main

    assert main(["toy-data", "--out", str(tmp_path), "--n-train", "6", "--n-valid", "2"]) == 0
    before = (tmp_path / "train.jsonl").read_text()
    capsys.readouterr()
    assert main(["toy-data", "--out", str(tmp_path), "--n-train", "4", "--n-valid", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "already holds train.jsonl, valid.jsonl" in err
    assert "--overwrite" in err and (tmp_path / "train.jsonl").read_text() == before
    assert main(["toy-data", "--out", str(tmp_path), "--n-train", "4", "--n-valid", "2",
                 "--overwrite"]) == 0
    assert len((tmp_path / "train.jsonl").read_text().splitlines()) == 4
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert main(["tiny-model", "--out", str(model)]) == 2
    assert "already holds config.json" in capsys.readouterr().err
    assert (model / "config.json").read_text() == "{}"


def test_reasoning_gym_commands_refuse_an_unknown_task_in_one_line(tmp_path, capsys):
    import pytest

    pytest.importorskip("reasoning_gym")
    from arealite.cli.main import main

    out = tmp_path / "rg"
    assert main(["rg-data", "--out", str(out), "--tasks", "chain_sum,gcdd"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "arealite: unknown reasoning-gym task 'gcdd'; closest: gcd", err
    assert main(["rg-data", "--out", str(out), "--tasks", "gcd", "--configs", '{"gcd": {"x": 1}}']) == 2
    assert "bad config" in capsys.readouterr().err
    # --configs that is JSON but not {task: {...}}: one line, for both commands alike
    assert main(["rg-data", "--out", str(out), "--tasks", "gcd", "--configs", "[1]"]) == 2
    err_configs = capsys.readouterr().err.strip()
    assert err_configs.startswith("arealite: task configs must be a JSON object"), err_configs
    assert "\n" not in err_configs
    assert not out.exists()  # refused before anything was written
    assert main(["real-model-job", "--configs", "[1]", f"cluster.fileroot={tmp_path}"]) == 2
    assert capsys.readouterr().err.strip() == err_configs
    # the job: the same line, before the model import, the data or any process
    assert main(["real-model-job", "--tasks", "gcdd", f"cluster.fileroot={tmp_path}"]) == 2
    assert capsys.readouterr().err.strip() == err
    assert list(tmp_path.iterdir()) == []
    assert main(["rg-data", "--out", str(out), "--tasks", "gcd", "--n-train", "4", "--n-valid", "2"]) == 0
    assert (out / "train.jsonl").read_text().count("\n") == 4



def test_asset_commands_with_their_defaults_make_the_main_jobs_assets(tmp_path):
    """#37: a user who builds an asset by hand where `make run` looks for it (as a refusal line
    or the SmolLM2 config's header says) gets the main job's own asset, so `make run` after it
    trains on the same task and model and its figures stay those of the README."""
    from arealite.cli.main import build_parser, main, tiny_model_spec
    from arealite.demo.main_job import build_assets
    from arealite.demo.tiny import TinyModelSpec

    assert main(["toy-data", "--out", str(tmp_path / "cli")]) == 0
    (tmp_path / "job" / "tiny_model").mkdir(parents=True)
    (tmp_path / "job" / "tiny_model" / "config.json").write_text("{}")  # only the task is built
    build_assets(tmp_path / "job")
    for name in ("train.jsonl", "valid.jsonl"):
        assert (tmp_path / "cli" / name).read_bytes() == \
            (tmp_path / "job" / "toy_math" / name).read_bytes()

    args = build_parser().parse_args(["tiny-model", "--out", str(tmp_path / "m")])
    assert tiny_model_spec(args) == TinyModelSpec()  # what build_assets builds (moe=False)
