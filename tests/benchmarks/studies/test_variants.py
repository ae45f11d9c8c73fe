"""benchmarks/studies/variants.py: its arguments, every variant's keys against the config schema, the
tables from metrics records; and one real 2-step variant through the launcher on the tiny model:
PPO with a critic, so the GRPO entry script's value model trains there too."""

from __future__ import annotations

import json
import re
import sys

import pytest

from benchmarks.studies import variants as vb
from tests.support.procs import log_tail, spawn


def test_args_defaults_and_errors():
    a = vb.parse_args([])
    assert (a.seconds, a.points, a.eval_every, a.eval_prompts) == (240.0, [30.0, 60.0, 120.0, 240.0], 20, None)
    assert a.variants == list(vb.VARIANTS)
    q = vb.parse_args(["--quick", "--variants", "grpo,dapo"])
    assert (q.seconds, q.points, q.eval_every, q.eval_prompts) == (20.0, [5.0, 10.0, 20.0], 5, 64)
    assert q.variants == ["grpo", "dapo"]
    assert vb.parse_args(["--seconds", "90"]).points == [30.0, 60.0, 90.0]
    for bad in (["--variants", "grpo,nope"], ["--variants", ","], ["--seconds", "0"],
                ["--points", "a,b"], ["--points", "0"], ["--minibatches", "0"],
                ["--override", "actor.eps_clip"]):
        with pytest.raises(SystemExit) as e:
            vb.parse_args(bad)
        assert e.value.code == 2


@pytest.mark.parametrize("name", list(vb.VARIANTS))
def test_every_variant_is_a_valid_config(name):
    """Each variant's keys load on top of the main job's config (the schema's own checks,
    e.g. Dr.GRPO's sum norm needing loss_agg_norm) and set what they say."""
    from arealite.api.config.loader import load_config

    over = vb.variant_overrides(name, 10)
    assert all("{" not in o for o in over)
    config = load_config(str(vb.CONFIG), over)
    for o in over:
        key, value = o.split("=")
        got = config
        for part in key.split("."):
            got = getattr(got, part)
        assert str(got).lower() == value or float(got) == float(value), (key, got, value)


def _records():
    recs = [{"step": 0, "eval/score": 0.4}]
    for s in range(1, 9):
        r = {"step": s, "timeperf/train_elapsed": 2.0 * s}
        if s % 4 == 0:
            r["eval/score"] = 0.5 if s == 4 else 0.7
        if s == 3:
            r["dynamic_sampling/drop_ratio"] = 0.5
        if s == 5:
            r["dynamic_sampling/drop_ratio"] = 0.1
        recs.append(r)
    return recs


def test_summary_and_tables():
    s = {**vb.summarize(_records()), "load_mean": 3.25}
    assert (s["steps"], s["train_s"], s["step_s"]) == (8, 16.0, 2.0)
    assert s["curve"] == [(0, 0.0, 0.4), (4, 8.0, 0.5), (8, 16.0, 0.7)]
    assert (s["initial_acc"], s["final_acc"], s["best_acc"]) == (0.4, 0.7, 0.7)
    assert s["drop_ratio"] == pytest.approx(0.3)
    # the last evaluation at or before t; the final one at the budget; nothing past the run's end
    assert [vb.acc_at_seconds(s, t, 15.0) for t in (1.0, 8.0, 12.0, 15.0, 30.0)] == [0.4, 0.5, 0.5, 0.7, None]
    assert [vb.acc_at_step(s, n) for n in (0, 4, 6, 8)] == [0.4, 0.5, None, 0.7]
    assert vb.default_step_points({"a": s}, 2) == [0, 2, 4, 8]
    st = vb.seconds_table({"grpo": s}, [8.0, 15.0, 30.0], 15.0)
    assert "| grpo | 0.50 | 0.70 | - | 8 | 2.000 | 3.2 |" in st
    sp = vb.steps_table({"grpo": s}, [0, 4, 6])
    assert "| grpo | 0.40 | 0.50 | - | 0.70 | 0.30 |" in sp
    with pytest.raises(ValueError):
        vb.summarize([{"step": 0, "eval/score": 0.4}])


def test_noise_gap_is_the_widest_gap_within_a_pair_of_equal_updates():
    def run(accs):
        return {"curve": [(i * 10, float(i), a) for i, a in enumerate(accs)]}

    runs = {"main": run([0.4, 0.5, 0.7]), "reinforce_pp": run([0.4, 0.55, 0.6]),
            "grpo": run([0.4, 0.6]), "cispo": run([0.4, 0.45, 0.9]), "rloo": run([0.4, 0.0, 0.0])}
    assert vb.noise_pairs(4) == [("main", "reinforce_pp")]
    assert vb.noise_gap(runs, [0, 10, 20], vb.noise_pairs(4)) == pytest.approx(0.1)
    # grpo has no step 20: only the steps both reached count; rloo is no pair
    assert vb.noise_gap(runs, [0, 10, 20], vb.noise_pairs(1)) == pytest.approx(0.15)
    assert vb.noise_gap({"rloo": runs["rloo"]}, [0, 10], vb.noise_pairs(1)) is None


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_one_variant_quick(tmp_path, tiny_model_dir, toy_data_dir):
    results = tmp_path / "results"
    cmd = [sys.executable, "-m", "benchmarks.studies.variants", "--quick", "--variants", "ppo_gae",
           "--seconds", "120", "--max-steps", "2", "--eval-every", "1", "--eval-prompts", "4",
           "--points", "0.001", "--prompts", "2", "--samples", "2",
           "--model-path", str(tiny_model_dir), "--data-dir", str(toy_data_dir),
           "--fileroot", str(tmp_path / "out"), "--results-dir", str(results), "--tag", "t"]
    with spawn(cmd) as (proc, log):
        try:
            code = proc.wait(timeout=240)  # one 2-step run
        except Exception:  # noqa: BLE001 - timeout: the context manager kills the group
            pytest.fail(f"benchmark did not finish in 240 s:\n{log_tail(log, 40)}")
        out = log_tail(log, 60)
    assert code == 0, out
    num = r"\d\.\d\d"
    for name in ("ppo_gae",):  # both tables, each with an accuracy per column
        assert re.search(rf"\| {name} \| {num} \| 2 \| \d+\.\d{{3}} \| \d+\.\d \|", out), out
        assert re.search(rf"\| {name} \| {num} \| {num} \| {num} \| {num} \| - \|", out), out
    r = json.loads((results / "variants_t.json").read_text())
    assert set(r["runs"]) == {"ppo_gae"}
    assert r["overrides"]["ppo_gae"] == vb.variant_overrides("ppo_gae", 10)
    logs = [json.loads(x) for x in next((tmp_path / "out").rglob("metrics.jsonl")).read_text().splitlines()]
    assert [x["step"] for x in logs if "value_loss" in x] == [1, 2]  # the critic trained each step
    for s in r["runs"].values():
        assert s["steps"] == 2 and s["train_s"] > 0 and [c[0] for c in s["curve"]] == [0, 1, 2]
        assert all(0.0 <= c[2] <= 1.0 for c in s["curve"]) and s["load_mean"] >= 0
    assert (results / "variants_t.png").stat().st_size > 1000

    # --report-only rebuilds the tables from the JSON, keeping when and how the runs were made
    assert vb.main([*cmd[3:], "--report-only"]) == 0
    again = json.loads((results / "variants_t.json").read_text())
    assert again["runs"] == r["runs"] and again["date"] == r["date"]
    assert again["steps_table"] == r["steps_table"]
