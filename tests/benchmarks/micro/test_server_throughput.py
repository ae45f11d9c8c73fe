"""The mixed-constrained benchmark's pair statistics and its row group on the results page."""

from __future__ import annotations

import statistics

from benchmarks.micro.server_throughput import page_entry, pair_summary


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
