import json
import math
import sys
import types

import pytest

from arealite.api.config.run import StatsLoggerConfig
from arealite.observe.stats_logger import (
    StatsLogger,
    format_console_line,
    plot_metrics,
    read_metrics,
)


def _stats(step: int) -> dict[str, float]:
    return {"rollout/reward/avg": step / 10, "eval/accuracy": 0.5 + step / 100,
            "rollout/staleness/avg": 1.0, "perf/tokens_per_sec": 1234.4, "other/x": float(step)}


def test_writes_jsonl_tensorboard_and_console(tmp_path):
    lines = []
    with StatsLogger(StatsLoggerConfig(), tmp_path, total_steps=3, rank=0,
                     write=lines.append) as lg:
        for s in (1, 2, 3):
            lg.commit(s, _stats(s))
    recs = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in recs] == [1, 2, 3]
    assert recs[1]["rollout/reward/avg"] == 0.2 and recs[2]["other/x"] == 3.0
    assert lines[0] == ("[#######.............] step 1/3 | reward 0.100 | eval_acc 0.510 | stale 1.00 | tok/s 1234")
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    pts = acc.Scalars("rollout/reward/avg")
    assert [(p.step, round(p.value, 6)) for p in pts] == [(1, 0.1), (2, 0.2), (3, 0.3)]


def test_console_shows_only_present_keys_in_fixed_order():
    line = format_console_line(7, {"perf/tokens_per_sec": 10.0, "rollout/reward/avg": 0.25})
    assert line == "step 7 | reward 0.250 | tok/s 10"
    assert format_console_line(1, {"eval/accuracy": math.nan}) == "step 1 | eval_acc nan"
    # a grader's own metrics reach the line by name (#37); eval/n, a count, does not
    line = format_console_line(4, {"eval/accuracy": 0.5, "eval/n": 16.0, "eval/exact": 0.25,
                                   "eval/mean_len": 3.0})
    assert line == "step 4 | exact 0.250 | eval_acc 0.500 | mean_len 3.000"
    # the default evaluation's figures by their names, never as eval_acc; per-task ones and
    # the gold's reference share stay in the metrics file
    line = format_console_line(5, {"eval/right": 0.5, "eval/exact": 0.25, "eval/format": 0.5,
                                   "eval/score": 0.3, "eval/collapse": 0.0, "eval/n": 8.0,
                                   "eval/gold_majority_share": 0.1, "eval/gcd/right": 0.4})
    assert line == ("step 5 | right 0.500 | exact 0.250 | format 0.500 | eval_score 0.300 "
                    "| collapse 0.000")


def test_print_every_and_non_finite_values(tmp_path):
    lines = []
    cfg = StatsLoggerConfig(tensorboard=False, print_every=2)
    with StatsLogger(cfg, tmp_path, rank=0, write=lines.append) as lg:
        for s in range(1, 6):
            lg.commit(s, {"rollout/reward/avg": math.nan if s == 2 else 1.0})
    assert [ln.split(" |")[0] for ln in lines] == ["step 2", "step 4"]
    recs = read_metrics(tmp_path / "metrics.jsonl")
    assert recs[1]["rollout/reward/avg"] is None  # valid JSON, not NaN
    assert not (tmp_path / "tensorboard").exists()


def test_only_rank0_writes(tmp_path):
    lines = []
    with StatsLogger(StatsLoggerConfig(), tmp_path / "r1", rank=1, write=lines.append) as lg:
        lg.commit(1, _stats(1))
    assert not (tmp_path / "r1").exists() and lines == []


def test_steps_must_increase(tmp_path):
    with StatsLogger(StatsLoggerConfig(tensorboard=False), tmp_path, rank=0,
                     write=lambda _: None) as lg:
        lg.commit(3, {})
        with pytest.raises(ValueError, match="after step 3"):
            lg.commit(3, {})


def test_resume_drops_steps_after_the_checkpoint(tmp_path):
    cfg = StatsLoggerConfig(tensorboard=False)
    with StatsLogger(cfg, tmp_path, rank=0, write=lambda _: None) as lg:
        for s in range(1, 6):
            lg.commit(s, {"v": float(s)})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "v": ')  # a line cut by the crash
    with StatsLogger(cfg, tmp_path, rank=0, start_step=3, write=lambda _: None) as lg:
        lg.commit(4, {"v": 40.0})
    assert [(r["step"], r["v"]) for r in read_metrics(tmp_path / "metrics.jsonl")] == [
        (1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0)]


def test_wandb_used_when_installed(tmp_path, monkeypatch):
    """wandb is not installed here: a stand-in module records the calls the logger makes."""
    calls = []
    run = types.SimpleNamespace(log=lambda d, step: calls.append(("log", step, dict(d))),
                                finish=lambda: calls.append(("finish",)))
    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: calls.append(("init", kw)) or run
    monkeypatch.setitem(sys.modules, "wandb", fake)
    cfg = StatsLoggerConfig(tensorboard=False, wandb_mode="offline", wandb_project="p")
    with StatsLogger(cfg, tmp_path, rank=0, run_name="exp/trial", write=lambda _: None) as lg:
        lg.commit(1, {"a": 1.0})
    assert calls[0][0] == "init" and calls[0][1]["project"] == "p"
    assert calls[0][1]["mode"] == "offline" and calls[0][1]["name"] == "exp/trial"
    assert calls[1] == ("log", 1, {"a": 1.0}) and calls[2] == ("finish",)


def test_wandb_missing_is_a_warning_not_a_crash(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    cfg = StatsLoggerConfig(tensorboard=False, wandb_mode="online")
    with StatsLogger(cfg, tmp_path, rank=0, write=lambda _: None) as lg:
        lg.commit(1, {"a": 1.0})
    assert "wandb is not installed" in capsys.readouterr().err


def test_plot_metrics(tmp_path):
    with StatsLogger(StatsLoggerConfig(tensorboard=False), tmp_path, rank=0,
                     write=lambda _: None) as lg:
        for s in range(1, 6):
            lg.commit(s, _stats(s))
    out = plot_metrics(tmp_path / "metrics.jsonl", tmp_path / "plots" / "reward.png",
                       keys=["rollout/reward/avg", "eval/accuracy", "absent"])
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000
    with pytest.raises(ValueError, match="none of"):
        plot_metrics(tmp_path / "metrics.jsonl", tmp_path / "x.png", keys=["absent"])


def test_jsonl_is_one_object_per_line(tmp_path):
    with StatsLogger(StatsLoggerConfig(tensorboard=False), tmp_path, rank=0,
                     write=lambda _: None) as lg:
        lg.commit(1, {"a": 1})
        lg.commit(2, {"a": math.inf})
    raw = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(raw) == 2 and json.loads(raw[1])["a"] is None
