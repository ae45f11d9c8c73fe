"""A user entry script's own options (#28): ``extra`` typed by ``extra_schema``, with the same
YAML, overrides, --dry-run and one-line errors as our keys; the time budget's lr check."""

from __future__ import annotations

import sys

import pytest

from arealite.api.config.loader import ConfigError, load_config, to_yaml

SCHEMA = '''
from pydantic import BaseModel, Field

class Options(BaseModel):  # pydantic's default (ignore unknown keys): the loader still refuses them
    max_eval_rows: int = Field(50, ge=1)
    grader: str = "exact"
'''


@pytest.fixture
def user_folder(tmp_path, monkeypatch):
    (tmp_path / "my_options.py").write_text(SCHEMA)
    (tmp_path / "task.yaml").write_text(
        "extra_schema: my_options:Options\nextra:\n  max_eval_rows: 7\n")
    monkeypatch.chdir(tmp_path)  # the user runs from their folder, as torchrun -m sees it
    yield tmp_path
    sys.modules.pop("my_options", None)


def test_extra_is_validated_by_the_user_model_with_overrides(user_folder):
    cfg = load_config("task.yaml", ["extra.grader=fuzzy"])
    assert type(cfg.extra).__name__ == "Options"
    assert (cfg.extra.max_eval_rows, cfg.extra.grader) == (7, "fuzzy")
    text = to_yaml(cfg)  # --dry-run prints the user's options too
    assert "max_eval_rows: 7" in text and "grader: fuzzy" in text


@pytest.mark.parametrize("override, fragment", [
    ("extra.max_eval_row=3", "unknown key 'extra.max_eval_row' (did you mean: max_eval_rows?)"),
    ("extra.max_eval_rows=0", "bad value for 'extra.max_eval_rows'"),
    ("extra_schema=my_options:Nope", "has no attribute 'Nope'"),
    ("extra_schema=nowhere:Options", "cannot import module 'nowhere'"),
])
def test_bad_user_options_are_one_line_config_errors(user_folder, override, fragment):
    with pytest.raises(ConfigError) as e:
        load_config("task.yaml", [override])
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_without_a_schema_extra_is_a_free_mapping():
    assert load_config(None, ["extra.anything=3"]).extra == {"anything": 3}
    with pytest.raises(ConfigError, match="'extra'"):
        load_config(None, ["extra=5"])


def test_user_options_error_exits_2_through_the_cli(user_folder, capsys):
    from arealite.cli.main import main

    assert main(["config", "task.yaml", "extra.grader=1", "extra.bogus=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "extra.bogus" in err


def test_time_budget_needs_a_schedule_without_a_length():
    with pytest.raises(ConfigError, match="lr_scheduler_type=constant"):
        load_config(None, ["total_train_seconds=60", "actor.optimizer.lr_scheduler_type=cosine"])
    ok = load_config(None, ["total_train_seconds=60", "actor.optimizer.warmup_steps=5"])
    assert ok.total_train_seconds == 60 and ok.actor.optimizer.warmup_steps == 5
    # a step cap gives the decay its length
    load_config(None, ["total_train_seconds=60", "total_train_steps=100",
                       "actor.optimizer.lr_scheduler_type=cosine"])
