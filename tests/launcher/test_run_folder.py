"""Runs never write into each other (#37): a launch into a folder holding a run is refused in
one line naming the folder and the two ways on, unless recovery resumes it or
launcher.overwrite=true replaces it; an output_dir holding a model is guarded the same way."""

from __future__ import annotations

from pathlib import Path

import pytest

from arealite.api.config.loader import load_config
from arealite.launcher import run_folder
from arealite.launcher.local import main
from arealite.launcher.plan import LaunchError
from arealite.utils.recover import INFO_FILE, MARKER
from tests.support.min_assets import min_assets

REPO = Path(__file__).resolve().parents[2]
GRPO = str(REPO / "configs" / "toy_grpo.yaml")
SFT = str(REPO / "configs" / "toy_sft.yaml")


def _earlier_run(run: Path) -> None:
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "metrics.jsonl").write_text('{"step": 0}\n')


def test_a_folder_holding_a_run_is_refused_in_one_line(tmp_path, capsys):
    over = min_assets(tmp_path)
    cfg = load_config(GRPO, over)
    assert run_folder.claim(cfg, "local").action == "fresh"
    _earlier_run(cfg.run_dir())
    assert main([GRPO, *over, "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert f"{cfg.run_dir()} already holds a run (logs/metrics.jsonl)" in err
    assert "trial_name=main-2" in err and "launcher.overwrite=true" in err
    # a new trial is a new folder
    assert main([GRPO, *over, "trial_name=main-2", "--dry-run"]) == 0
    # a folder with only a failed launch's logs holds no run
    (cfg.run_dir("logs") / "metrics.jsonl").unlink()
    (cfg.run_dir("logs") / "trainer.log").write_text("Traceback ...\n")
    assert run_folder.claim(cfg, "local").action == "fresh"


def test_overwrite_empties_the_folder_first(tmp_path):
    over = min_assets(tmp_path)
    cfg = load_config(GRPO, [*over, "launcher.overwrite=true"])
    _earlier_run(cfg.run_dir())
    (cfg.run_dir("checkpoints") / "step20").mkdir(parents=True)
    claim = run_folder.claim(cfg, "local")
    assert claim.action == "overwrite" and cfg.run_dir("logs", "metrics.jsonl").is_file()
    claim.apply()
    assert not cfg.run_dir().exists()


def test_recovery_resumes_only_from_a_complete_checkpoint(tmp_path):
    over = [*min_assets(tmp_path), "recover.mode=auto"]
    cfg = load_config(GRPO, over)
    _earlier_run(cfg.run_dir())
    with pytest.raises(LaunchError, match="already holds a run"):  # nothing to resume from
        run_folder.claim(cfg, "local")
    ckpt = cfg.run_dir("recover", "step00000010")
    ckpt.mkdir(parents=True)
    (ckpt / MARKER).write_text("")
    (ckpt / INFO_FILE).write_bytes(b"")
    assert run_folder.claim(cfg, "local").action == "resume"
    disabled = load_config(GRPO, [*over, "recover.mode=disabled"])
    with pytest.raises(LaunchError, match="already holds a run"):  # recovery did not ask
        run_folder.claim(disabled, "local")


def test_server_only_writes_no_run(tmp_path):
    cfg = load_config(GRPO, min_assets(tmp_path))
    _earlier_run(cfg.run_dir())
    assert run_folder.claim(cfg, "server_only").action == "fresh"


def test_an_sft_never_writes_into_a_model_it_does_not_own(tmp_path, capsys):
    """The quickstart's LoRA SFT used to write its adapter into the main job's warm start."""
    over = min_assets(tmp_path, "model.path")
    warm = tmp_path / "assets" / "sft_model"
    warm.mkdir(parents=True)
    (warm / "config.json").write_text("{}")
    (warm / "model.safetensors").write_bytes(b"weights")
    # the shipped config writes into its own run folder
    cfg = load_config(SFT, [*over, "model.lora.rank=8"])
    assert cfg.output_dir == "" and run_folder.claim(cfg, "local").action == "fresh"
    # pointed at a model folder: refused, nothing touched
    assert main([SFT, *over, f"output_dir={warm}", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"output_dir {warm} already holds a model" in err
    # replaced on request: its model files go (and only they)
    (warm / "notes.txt").write_text("mine")
    cfg = load_config(SFT, [*over, f"output_dir={warm}", "launcher.overwrite=true"])
    run_folder.claim(cfg, "local").apply()
    assert sorted(p.name for p in warm.iterdir()) == ["notes.txt"]


def test_a_trainer_started_by_hand_decides_as_a_launcher_does(tmp_path, capsys, monkeypatch):
    """docs/quickstart.md's by-hand trainer (torchrun -m arealite.trainer.grpo), run twice into
    one trial, is refused the second time instead of appending; a launcher's trainers (and its
    restarts) are not asked again."""
    from arealite.api.config.experiment import GRPOConfig
    from arealite.launcher.plan import CLAIMED_ENV, trainer_spec
    from arealite.trainer.common import config_from_argv

    over = min_assets(tmp_path)
    cfg = load_config(GRPO, over)
    _earlier_run(cfg.run_dir())
    monkeypatch.delenv(CLAIMED_ENV, raising=False)
    monkeypatch.setattr("sys.argv", ["grpo", GRPO, *over])
    with pytest.raises(SystemExit) as e:
        config_from_argv(None, GRPOConfig)
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{cfg.run_dir()} already holds a run" in err
    # called with its arguments (in-process, as the tests and benchmarks do) it is not asked
    assert config_from_argv([GRPO, *over], GRPOConfig).trial_name == "main"
    # a launcher's trainer: the launcher decided (and a restart resumes the folder)
    assert trainer_spec(cfg, GRPO, over, 29500, ["127.0.0.1:1"]).env[CLAIMED_ENV] == "1"
    run_folder.claim_by_hand(cfg, {CLAIMED_ENV: "1"})
    # overwrite by hand: rank 0 empties the folder, the other ranks only decide
    cfg = load_config(GRPO, [*over, "launcher.overwrite=true"])
    run_folder.claim_by_hand(cfg, {"RANK": "1"})
    assert run_folder.holds_run(cfg.run_dir()) == ["logs/metrics.jsonl"]
    run_folder.claim_by_hand(cfg, {"RANK": "0"})
    assert not cfg.run_dir().exists()
