"""The server section is ``servers:``; configs and overrides that still say ``sglang`` load the
same config, with one warning line."""

from __future__ import annotations

import logging
from pathlib import Path

from arealite.api.config.loader import load_config

TOY = Path(__file__).resolve().parents[2] / "configs" / "toy_grpo.yaml"


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_an_old_sglang_section_loads_the_same_config_with_one_warning(tmp_path, caplog):
    text = TOY.read_text()
    assert "\nservers:\n" in text
    old = tmp_path / "old.yaml"
    old.write_text(text.replace("\nservers:\n", "\nsglang:\n"))
    with caplog.at_level(logging.WARNING):
        new_cfg = load_config(TOY)
    assert _warnings(caplog) == []
    with caplog.at_level(logging.WARNING):
        old_cfg = load_config(old, ["sglang.log_level=info"])  # file and override: one line
    (line,) = _warnings(caplog)
    assert "rename `sglang:` to `servers:`" in line and "\n" not in line
    assert old_cfg.model_dump() == new_cfg.model_copy(
        update={"servers": new_cfg.servers.model_copy(update={"log_level": "info"})}).model_dump()


def test_an_old_override_sets_the_servers_section(caplog):
    with caplog.at_level(logging.WARNING):
        cfg = load_config(TOY, ["sglang.dtype=float16", "servers.tp_size=1"])
    assert cfg.servers.dtype == "float16" and len(_warnings(caplog)) == 1
    assert load_config(TOY, ["servers.dtype=float16"]).model_dump() == cfg.model_dump()
