"""rg_gains' bookkeeping: outcomes by task, format gains, scored by the task's own verifier."""

from __future__ import annotations

import pytest

from benchmarks.studies.rg_gains import compare, holds_answer

pytest.importorskip("reasoning_gym")


def test_holds_answer_takes_whole_tokens_only() -> None:
    assert holds_answer(" 5 + 1 = 6", "6")
    assert holds_answer("The GCD is 9.", "9")
    assert not holds_answer(" 16", "6")
    assert not holds_answer(" -6", "6")
    assert not holds_answer(" 6.5", "6")


def test_compare_counts_outcomes_by_task() -> None:
    from arealite.dataset.reasoning_gym import TaskSpec, build_rows

    rows = build_rows(
        [TaskSpec("chain_sum", 1.0, {"min_terms": 2, "max_terms": 2})],
        4,
        0,
        "valid",
        "direct",
        answer_prefix="<answer>",
    )
    gold = [r["answer"] for r in rows]
    base = [f" x = {gold[0]}", gold[1], gold[2], "nothing"]  # format-only, right, right, wrong
    trained = [gold[0], gold[1], "nothing", "still nothing"]
    table = compare(rows, base, trained)
    rec = table["chain_sum"]
    assert (rec["n"], rec["right_both"], rec["gained"], rec["lost"], rec["wrong_both"]) == (
        4,
        1,
        1,
        1,
        1,
    )
    assert rec["format_gains"] == 1
    # two right answers, a format-only one (at most partial credit) and a wrong one
    assert 0.5 <= rec["score_base"] < 0.75
    assert 0.5 <= rec["score_trained"] < 0.75
    assert {e["outcome"] for e in rec["examples"]} == {"gained", "lost"}
