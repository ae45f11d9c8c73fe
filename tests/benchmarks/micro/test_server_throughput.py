"""The mixed-constrained benchmark's pair statistics, and the row groups of kept runs (mixed
constrained; the job's own requests) on the results page."""

from __future__ import annotations

import statistics

from benchmarks.micro.server_throughput import page_entry, pair_summary, rows_entry


def test_pair_summary_is_the_median_and_quartiles_of_the_pairs():
    ratios = [0.9, 1.2, 0.7, 1.0, 0.95]
    got = pair_summary(ratios)
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    assert got == {"median": 0.95, "q1": q1, "q3": q3, "min": 0.7, "max": 1.2}
    assert pair_summary([0.8])["q1"] == 0.8  # one pair: no spread


def test_page_entry_turns_a_kept_run_into_checked_figures():
    run = {"model_tag": "tiny", "pairs": 4, "date": "2026-11-28 02:00 UTC", "command": "python -m x",
           "requests": 64, "vocab": 330, "max_new_tokens": 256, "cores": 2, "load_average_start_end": [7.1, 8.2],
           "headlines": [
               "unconstrained throughput mixed / all-unconstrained by wall clock (median of 4 "
               "pairs, quartiles 0.900-1.000): 0.940 (target >= 0.95)",
               "unconstrained tokens per server CPU second mixed / all-unconstrained (median of "
               "4 pairs, quartiles 0.950-1.050): 1.010 (target >= 0.95)"]}
    e = page_entry(run)
    assert e["name"] == "server_throughput, mixed constrained (tiny, 4 pairs, ran 2026-11-28)"
    assert [(f["value"], f["met"]) for f in e["figures"]] == [("0.940", False), ("1.010", True)]
    assert e["figures"][1]["name"].startswith("unconstrained tokens per server CPU second mixed")
    assert "load average 7.1-8.2 on 2 cores" in e["about"] and "(vocabulary 330)" in e["about"]


def test_rows_entry_checks_both_ratios_of_a_kept_run_on_the_jobs_requests():
    heads = ["ratio server / one-at-a-time : 9.23x (target >= 5x)",
             "ratio server / static batch  : 1.34x (target >= 1.5x)"]
    run = {"model_tag": "smollm2", "requests": 64, "date": "2026-11-28 07:47 UTC", "command": "python -m x",
           "rows": "rg/train.jsonl", "group": 8, "max_new_tokens": 12, "rounds": 3, "cores": 2,
           "load_average_start_end": [0.4, 1.0], "lines": ["round 0: ...", *heads], "headlines": heads}
    e = rows_entry(run)
    assert e["name"] == "server_throughput on the job's requests (smollm2, 64 requests, ran 2026-11-28)"
    assert [(f["value"], f["met"]) for f in e["figures"]] == [("9.23x", True), ("1.34x", False)]
    assert "each 8 times as a GRPO group" in e["about"] and "load average 0.4-1.0 on 2 cores" in e["about"]
