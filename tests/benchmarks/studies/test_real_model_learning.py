"""The learning-run study's reading of a run's metrics: held-out right answers against training
minutes, the best rise over step 0, the majority-answer shares at the end, the reward of the first
and last steps, and the line over seeds that carries the target. (The runs themselves take a real model and minutes: docs/real_model.md.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.harness.report import parse_figures
from benchmarks.studies.real_model_learning import job_args, read_metrics, report, summarize


def write_run(path: Path, evals: dict[int, float], steps: int, step_s: float = 30.0) -> Path:
    """A metrics.jsonl as the trainer writes it: one row per step, the evaluation in its step's row
    (step 0: the evaluation alone), keys the study does not keep among them."""
    def ev(v: float) -> dict[str, float]:  # right, and the figures the study shows beside it
        return {"eval/right": v, "eval/exact": v / 2, "eval/score": 0.9, "eval/n": 200.0,
                "eval/chain_sum/right": v, "eval/majority_share": 0.2,
                "eval/gold_majority_share": 0.1, "eval/chain_sum/majority_share": 0.3,
                "eval/chain_sum/gold_majority_share": 0.12}

    rows = [{"step": 0, "elapsed_s": 1.0, **ev(evals[0])}]
    for s in range(1, steps + 1):
        row = {"step": s, "reward": s / steps, "timeperf/step": step_s,
               "timeperf/train_elapsed": s * step_s, "grad_norm": 1.0}
        if s in evals:
            row.update(ev(evals[s]))
        rows.append(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_summary_reads_evaluations_minutes_best_rise_and_rewards(tmp_path):
    rows = read_metrics(write_run(tmp_path / "m.jsonl", {0: 0.1, 10: 0.3, 20: 0.45, 30: 0.45}, 30))
    assert all("grad_norm" not in r for r in rows)
    s = summarize(rows)
    assert [e["step"] for e in s["evals"]] == [0, 10, 20, 30]
    assert [e["train_minutes"] for e in s["evals"]] == [0.0, 5.0, 10.0, 15.0]
    # the measure is right answers, not the mean score (0.9 throughout here)
    assert [e["right"] for e in s["evals"]] == [0.1, 0.3, 0.45, 0.45]
    assert s["evals"][1]["exact"] == 0.15 and s["evals"][1]["chain_sum/right"] == 0.3
    assert s["majority_at_end"] == {"": [0.2, 0.1], "chain_sum": [0.3, 0.12]}
    # the best is the first step that reached it
    assert (s["best"], s["best_step"], s["best_minutes"], s["best_rise"]) == (0.45, 20, 10.0, 0.35)
    # rewards s/30: mean of 1..10 is 5.5/30, of 21..30 is 25.5/30
    assert s["reward_first10"] == round(5.5 / 30, 3) and s["reward_last10"] == round(25.5 / 30, 3)


def test_a_run_without_a_first_evaluation_is_refused(tmp_path):
    rows = read_metrics(write_run(tmp_path / "m.jsonl", {0: 0.1, 10: 0.3}, 10))
    with pytest.raises(ValueError, match="step 0"):
        summarize(rows[1:])


def test_the_headline_is_the_smallest_rise_and_the_report_parses_it(tmp_path):
    a = summarize(read_metrics(write_run(tmp_path / "a.jsonl", {0: 0.1, 10: 0.4}, 10)))
    b = summarize(read_metrics(write_run(tmp_path / "b.jsonl", {0: 0.1, 10: 0.19}, 10)))
    text = report({1: a, 2: b})
    assert "seed 2: best right 0.190 at step 10 (5.0 min), rise +0.090" in text
    assert "seed 2: majority-answer share at the end: all 0.20 (gold 0.10), chain_sum 0.30" in text
    (fig,) = parse_figures("real_model_learning", text)
    assert fig.value.startswith("+0.090") and fig.met is False
    # a best that came after the time limit is said in the line
    late = summarize(read_metrics(write_run(tmp_path / "c.jsonl", {0: 0.1, 10: 0.5}, 10, 200.0)))
    assert "after 30.0 min" in report({3: late})


def test_every_seed_runs_the_same_protocol_but_its_own_seed():
    one, two = job_args(1, 60, 10, "/r", "learn"), job_args(2, 60, 10, "/r", "learn")
    assert [x for x in one if "seed" not in x and "trial" not in x] == \
           [x for x in two if "seed" not in x and "trial" not in x]
    assert {"seed=2", "servers.random_seed=2", "trial_name=learn2"} <= set(two)


def test_answer_changes_sort_each_row_and_show_the_replies(tmp_path):
    from benchmarks.studies.real_model_learning import answer_changes, answer_lines

    def rec(step, i, right, reply, answer):
        prompt = f"<|im_start|>user\nq{i} =<|im_end|>\n<|im_start|>assistant\n<answer>"
        return {"step": step, "id": i, "task": "chain_sum", "prompt": prompt, "reply": reply,
                "gold": str(i), "answer": answer, "right": right}

    first = [rec(0, 0, True, "0</answer>", "0"), rec(0, 1, False, "7</answer>", "7"),
             rec(0, 2, True, "2</answer>", "2"), rec(0, 3, False, "9</answer>", "9")]
    last = [rec(30, 0, True, "0</answer>", "0"), rec(30, 1, True, "1</answer>", "1"),
            rec(30, 2, False, "1</answer>", "1"), rec(30, 3, False, "1</answer>", "1")]
    path = tmp_path / "heldout_completions.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in first + last))
    c = answer_changes(path)
    t = c["tasks"]["chain_sum"]
    assert c["steps"] == [0, 30] and t["n"] == 4
    assert (t["right in both"], t["gained"], t["lost"], t["wrong in both"]) == (1, 1, 1, 1)
    assert t["top_answers_at_end"][0] == ["1", 0.75] and t["gold_top"][1] == 0.25
    assert t["gained_examples"] == [{"question": "q1 =", "gold": "1", "first": "7</answer>",
                                     "last": "1</answer>"}]
    text = "\n".join(answer_lines(1, c))
    assert "gained 1, lost 1" in text and "'7</answer>' -> '1</answer>'" in text
