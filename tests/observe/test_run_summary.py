"""The end-of-run summary: the curves a run logged, the held-out completions named, the last
held-out evaluation by its figures' names (and the tasks that collapsed)."""

from __future__ import annotations

from arealite.api.config.run import StatsLoggerConfig
from arealite.observe.heldout_eval import COMPLETIONS_FILE
from arealite.observe.run_summary import last_evaluation, summarize_run
from arealite.observe.stats_logger import StatsLogger


def test_the_summary_names_the_completions_and_the_last_evaluation(tmp_path):
    logs = tmp_path / "logs"
    with StatsLogger(StatsLoggerConfig(tensorboard=False), logs, rank=0, write=lambda _: None) as lg:
        lg.commit(0, {"eval/right": 0.4, "eval/exact": 0.1, "eval/format": 0.2, "eval/score": 0.15})
        lg.commit(1, {"reward": 0.3})
        lg.commit(2, {"reward": 0.5, "eval/right": 0.45, "eval/exact": 0.4, "eval/format": 0.9,
                      "eval/score": 0.42, "eval/gcd/collapse": 1.0, "eval/collapse": 0.0})
    (logs / COMPLETIONS_FILE).write_text("{}\n")
    lines: list[str] = []
    png = summarize_run(tmp_path, 12.0, 0, "x/y", write=lines.append)
    assert png is not None and png.is_file()
    text = "\n".join(lines)
    assert f"held-out completions: {logs / COMPLETIONS_FILE}" in text
    assert ("last held-out evaluation, step 2: right 0.450 | exact 0.400 | format 0.900 | "
            "score 0.420 | COLLAPSE: gcd") in text
    assert "tensorboard" not in text  # not written by this run


def test_no_metrics_no_summary_and_an_eval_fn_accuracy_is_shown_as_such(tmp_path):
    assert summarize_run(tmp_path, 1.0, 1, "t", write=lambda _: None) is None
    assert last_evaluation([{"step": 3, "eval/accuracy": 0.5}]) == "step 3: accuracy 0.500"
    assert last_evaluation([{"step": 1, "reward": 0.2}]) is None
    assert last_evaluation([{"step": 4, "eval/right": 0.9, "eval/collapse": 1.0}]).endswith("COLLAPSE: all")
