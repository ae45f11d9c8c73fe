"""benchmarks/studies/vs_trl_figures.py: the figures of a vs_trl run from its arms' summaries (time
to target and its grid bound, the ratios per seed and of the means, the table, the headline lines
the results page reads, the page entry). Pure functions: no run."""

from __future__ import annotations

import pytest

from benchmarks.harness.report import parse_figures
from benchmarks.studies import vs_trl, vs_trl_figures


def test_time_to_target_is_the_first_evaluation_at_or_above_it():
    curve = [(0.0, 0.3), (10.0, 0.6), (20.0, 0.81), (30.0, 0.7), (40.0, 0.9)]
    assert vs_trl_figures.time_to_target(curve, 0.8) == 20.0
    assert vs_trl_figures.time_to_target(curve, 0.6) == 10.0
    assert vs_trl_figures.time_to_target(curve, 0.95) is None
    assert vs_trl_figures.time_to_target([(0.0, 0.3), (5.0, 0.699999988079071)], 0.7) == 5.0  # float32 0.7


def test_tta_ratio_exact_bound_and_missing():
    assert vs_trl_figures.tta_ratio({"tta_s": 30.0}, {"tta_s": 120.0, "train_s": 300.0}) == (0.25, "exact")
    # only ours reached it: theirs would need more than its whole budget
    assert vs_trl_figures.tta_ratio({"tta_s": 30.0}, {"tta_s": None, "train_s": 300.0}) == (0.1, "upper bound")
    # only theirs reached it: ours would need more than its whole training time
    assert vs_trl_figures.tta_ratio({"tta_s": None, "train_s": 150.0}, {"tta_s": 50.0}) == (3.0, "lower bound")
    assert vs_trl_figures.tta_ratio({"tta_s": None, "train_s": 150.0}, {"tta_s": None}) == (None, "not reached")


def _arealite_records():
    recs = [{"step": 0, "eval/right": 0.35, "timeperf/eval": 1.0}]
    for s in range(1, 21):
        r = {"step": s, "timeperf/step": 0.5, "timeperf/train_elapsed": 0.5 * s, "timeperf/rollout_wait": 0.1,
             "timeperf/logp": 0.0, "timeperf/update": 0.3, "timeperf/weight_sync": 0.05}
        if s % 10 == 0:
            r["eval/right"] = 0.6 if s == 10 else 0.82
        recs.append(r)
    return recs


def test_summaries_of_both_sides():
    ar = vs_trl_figures.arealite_summary(_arealite_records(), target=0.8)
    assert ar["steps"] == 20 and ar["train_s"] == 10.0 and ar["step_s"] == 0.5
    assert ar["curve"] == [(0.0, 0.35), (5.0, 0.6), (10.0, 0.82)]
    assert ar["tta_s"] == 10.0 and ar["final_acc"] == 0.82
    assert ar["phases"]["update"] == pytest.approx(0.3)
    trl = vs_trl_figures.trl_summary({"steps": 10, "train_s": 20.0, "curve": [[0, 0.0, 0.35], [10, 20.0, 0.7]],
                              "phases": {"generate": 0.8, "train": 1.2}}, target=0.8)
    assert trl["step_s"] == 2.0 and trl["tta_s"] is None and trl["best_acc"] == 0.7
    with pytest.raises(ValueError):
        vs_trl_figures.arealite_summary([{"step": 0, "eval/right": 0.3}], target=0.8)


def test_headlines_carry_the_targets_the_results_page_checks():
    runs = {"trl": vs_trl_figures.trl_summary({"steps": 10, "train_s": 20.0, "curve": [[0, 0.0, 0.35], [10, 20.0, 0.85]],
                                       "phases": {}}, 0.8),
            "async": vs_trl_figures.arealite_summary(_arealite_records(), 0.8)}
    lines = vs_trl_figures.headlines(runs, 0.8)
    figs = {f.name: f for f in parse_figures("vs_trl", "\n".join(lines))}
    step = figs["arealite async / TRL seconds per step"]
    assert (step.value, step.met) == ("0.25x", True)  # 0.5 s vs 2.0 s
    tta = figs["arealite async / TRL time to 0.80 held-out right"]
    assert (tta.value, tta.met) == ("0.50x", True)  # 10 s vs 20 s
    table = vs_trl_figures.table(runs, 0.8)
    assert "| TRL GRPOTrainer | 10 | 20.0 | 2.000 |" in table and "0.35 → 0.82 (0.82) | 10.0 |" in table
    assert vs_trl_figures.headlines({"async": runs["async"]}, 0.8) == []
    runs["trl"]["tta_s"] = None  # TRL never reached it: the ratio is a bound from its budget
    bound = {f.name: f for f in parse_figures("vs_trl", "\n".join(vs_trl_figures.headlines(runs, 0.8)))}
    assert bound["arealite async / TRL time to 0.80 held-out right"].value == "0.50x"
    assert any("upper bound" in line for line in vs_trl_figures.headlines(runs, 0.8))


def test_page_entry_of_a_saved_full_run():
    runs = {"trl": vs_trl_figures.trl_summary({"steps": 10, "train_s": 20.0, "curve": [[0, 0.0, 0.35], [10, 20.0, 0.85]],
                                       "phases": {}}, 0.8),
            "async": vs_trl_figures.arealite_summary(_arealite_records(), 0.8)}
    saved = {"command": "python -m benchmarks.studies.vs_trl --seconds 20", "date": "2026-01-01 00:00",
             "args": vars(vs_trl.parse_args(["--seconds", "20"])), "table": vs_trl_figures.table(runs, 0.8),
             "headlines": vs_trl_figures.headlines(runs, 0.8)}
    e = vs_trl_figures.page_entry(saved)
    assert e["name"].startswith("vs_trl, last full run (20 training s each")
    assert [f["met"] for f in e["figures"]] == [True, True]
    assert e["notes"][0].startswith("| system |") and e["command"] == saved["command"]
    assert e["status"] == "ran 2026-01-01 00:00"
    saved["arms"] = {"trl-2t-s1": {"commit": "aaa"}, "async-s1": {"commit": "ccc"}, "sync-s1": {"commit": "bbb"},
                     "async-s2": {"commit": "ccc"}}
    assert vs_trl_figures.page_entry(saved)["status"] == "ran 2026-01-01 00:00 (arealite's arms at bbb, ccc)"


def test_several_seeds_report_each_seed_and_the_means():
    assert vs_trl_figures.run_key("async", 2, [1]) == "async" and vs_trl_figures.run_key("trl-1t", 2, [1, 2]) == "trl-1t-s2"
    assert vs_trl_figures.split_key("trl-1t-s2") == ("trl-1t", 2) and vs_trl_figures.split_key("sync") == ("sync", None)
    assert vs_trl_figures.label("async-s2") == "arealite async (eta=2), seed 2"

    def trl(step_s, tta):
        return vs_trl_figures.finish({"steps": 10, "train_s": 10 * step_s, "phases": {},
                              "curve": [(0.0, 0.3), (tta, 0.8)] if tta else [(0.0, 0.3)]}, 0.8)

    def mean_line(runs):
        return next(x for x in vs_trl_figures.headlines(runs, 0.8)
                    if x.startswith("arealite async / TRL time to 0.80 held-out right (mean"))

    runs = {"trl-1t-s1": trl(2.0, 20.0), "async-s1": trl(1.0, 8.0),
            "trl-1t-s2": trl(2.0, 40.0), "async-s2": trl(1.0, 22.0)}
    lines = vs_trl_figures.headlines(runs, 0.8)
    figs = {f.name: f for f in parse_figures("vs_trl", "\n".join(lines))}
    # each seed's ratio (0.40x, 0.55x) is shown without a target; the means carry the targets
    assert any(line.startswith("seed 1: arealite async / TRL time to 0.80 held-out right: 0.40x (no target)")
               for line in lines)
    assert any(line.startswith("seed 2: arealite async / TRL time to 0.80 held-out right: 0.55x") for line in lines)
    mean = figs["arealite async / TRL time to 0.80 held-out right (mean over seeds 1,2)"]
    assert (mean.value, mean.met) == ("0.50x", True)  # (8 + 22) / (20 + 40)
    assert figs["arealite async / TRL seconds per step (mean over seeds 1,2)"].value == "0.50x"
    runs["async-s2"] = trl(1.0, None)  # ours missed it in one seed: its whole 10 s counts, a lower bound
    last = mean_line(runs)
    assert last.endswith("0.30x (target <= 0.5) [a lower bound: arealite async did not reach it in every seed]")
    runs["async-s2"], runs["trl-1t-s1"] = trl(1.0, 22.0), trl(2.0, None)  # TRL missed it: an upper bound
    last = mean_line(runs)
    assert last.endswith("0.50x (target <= 0.5) [an upper bound: TRL did not reach it in every seed]")
    runs["async-s2"] = trl(1.0, None)  # both sides missed it in some seed: no figure
    last = mean_line(runs)
    assert "not reached in every seed" in last and not parse_figures("vs_trl", last)
    assert "| arealite async (eta=2), seed 2 |" in vs_trl_figures.table(runs, 0.8)


def test_the_evaluation_grid_bound_takes_trl_at_its_last_evaluation_below():
    """TRL evaluated every 40 s, arealite every 10 s: the ratio at the first evaluations at or
    above the target, and at most what it is with TRL at its last evaluation below it."""
    assert vs_trl_figures.last_below([(0.0, 0.3), (40.0, 0.5), (80.0, 0.9), (120.0, 0.7)], 0.8) == 40.0
    assert vs_trl_figures.last_below([(0.0, 0.9), (40.0, 0.5)], 0.8) is None  # reached at once
    assert vs_trl_figures.last_below([(0.0, 0.3), (40.0, 0.5)], 0.8) is None  # never

    def run(curve):
        return vs_trl_figures.finish({"steps": 10, "train_s": 120.0, "phases": {}, "curve": curve}, 0.8)

    runs = {"trl-1t-s1": run([(0.0, 0.3), (40.0, 0.5), (80.0, 0.8)]),
            "async-s1": run([(0.0, 0.3), (10.0, 0.5), (20.0, 0.6), (30.0, 0.8)]),
            "trl-1t-s2": run([(0.0, 0.3), (40.0, 0.6), (80.0, 0.7), (120.0, 0.85)]),
            "async-s2": run([(0.0, 0.3), (30.0, 0.6), (40.0, 0.81)])}
    lines = vs_trl_figures.headlines(runs, 0.8)
    seed1 = next(x for x in lines if x.startswith("seed 1: arealite async / TRL time to"))
    assert "0.38x (no target) [at most 0.75x with TRL at its last evaluation below the target]" in seed1
    mean = next(x for x in lines if x.startswith("arealite async / TRL time to 0.80 held-out right (mean"))
    # (30 + 40) / (80 + 120) = 0.35; with TRL at 40 and 80 s: 70 / 120 = 0.58
    assert mean.endswith("0.35x (target <= 0.5) [at most 0.58x with TRL at its last evaluation below the target]")


def test_async_speedup_over_sync_per_seed_and_of_the_means():
    def run(step_s):
        return vs_trl_figures.finish({"steps": 10, "train_s": 10 * step_s, "phases": {}, "curve": [(0.0, 0.3)]}, 0.8)

    runs = {"trl-2t-s1": run(4.0), "async-s1": run(1.0), "sync-s1": run(1.5),
            "trl-2t-s2": run(4.0), "async-s2": run(2.0), "sync-s2": run(2.5)}
    lines = vs_trl_figures.headlines(runs, 0.8)
    assert "seed 1: arealite sync / async seconds per step (speed-up of async): 1.50x (no target; AReaL reports 2.77x)" in lines
    assert "seed 2: arealite sync / async seconds per step (speed-up of async): 1.25x (no target; AReaL reports 2.77x)" in lines
    assert lines[-1].endswith("mean over seeds 1,2): 1.33x (no target; AReaL reports 2.77x)")  # 4.0 / 3.0
    one = vs_trl_figures.headlines({"trl-2t": run(4.0), "async": run(1.0), "sync": run(1.2)}, 0.8)
    assert one[-1] == "arealite sync / async seconds per step (speed-up of async): 1.20x (no target; AReaL reports 2.77x)"
    assert not any("speed-up" in line for line in vs_trl_figures.headlines({"trl-2t": run(4.0), "async": run(1.0)}, 0.8))
    # the real job's saved run is named as such on the results page, with its own file
    saved = {"command": "c", "date": "d", "args": {**vars(vs_trl.parse_args(["--job", "real", "--seconds", "450"]))},
             "table": vs_trl_figures.table(runs, 0.8), "headlines": lines}
    e = vs_trl_figures.page_entry(saved, "vs_trl_real_3seeds.json")
    assert e["name"].startswith("vs_trl, SmolLM2 on reasoning-gym (--job real), last full run (450 training s each")
    assert e["about"].endswith("`benchmarks/results/vs_trl/vs_trl_real_3seeds.json`.")


def test_the_best_trl_run_is_the_fastest_per_step_and_the_first_to_the_target():
    slow = vs_trl_figures.trl_summary({"steps": 10, "train_s": 40.0, "curve": [[0, 0.0, 0.3], [10, 40.0, 0.75]]}, 0.7)
    fast = vs_trl_figures.trl_summary({"steps": 20, "train_s": 40.0, "curve": [[0, 0.0, 0.3], [20, 40.0, 0.6]]}, 0.7)
    runs = {"trl-1t": slow, "trl-2t": fast, "async": vs_trl_figures.arealite_summary(_arealite_records(), 0.7)}
    lines = vs_trl_figures.headlines(runs, 0.7)
    # seconds per step against the faster TRL (2.0 s), time to target against the one that got there
    assert lines[0].startswith("arealite async / TRL seconds per step: 0.25x") and "2 threads" in lines[0]
    assert lines[1].startswith("arealite async / TRL time to 0.70 held-out right: 0.25x") and "1 thread]" in lines[1]
    assert vs_trl_figures.label("trl-2t") == "TRL GRPOTrainer, 2 threads" and "| TRL GRPOTrainer, 1 thread |" in vs_trl_figures.table(runs, 0.7)


def _slow_mean_crossing(curves, target, dt=0.01):
    """The reference: every seed's accuracy stepped through in ``dt`` seconds (linear between
    its evaluations by hand), averaged, and the first time the average reaches ``target``."""
    end = min(c[-1][0] for c in curves)
    t = 0.0
    while t <= end + 1e-9:
        accs = []
        for c in curves:
            i = max(j for j in range(len(c)) if c[j][0] <= t + 1e-12)
            if i == len(c) - 1:
                accs.append(c[i][1])
            else:
                (t0, a0), (t1, a1) = c[i], c[i + 1]
                accs.append(a0 + (a1 - a0) * (t - t0) / (t1 - t0))
        if sum(accs) / len(accs) >= target - 1e-6:
            return t
        t += dt
    return None


def test_the_mean_curve_crossing_matches_a_stepped_reference():
    """Seeds evaluated on different grids: the mean curve (exact at every seed's evaluation
    times) reaches the target where averaging the seeds second by second first does."""
    import random

    rng = random.Random(0)
    for _ in range(20):
        curves = []
        for _seed in range(3):
            t, c = 0.0, [(0.0, 0.1)]
            while t < 60.0:
                t += rng.uniform(3.0, 12.0)
                c.append((t, min(1.0, max(0.0, c[-1][1] + rng.uniform(-0.05, 0.1)))))
            curves.append(c)
        target = rng.uniform(0.15, 0.4)
        fast = vs_trl_figures.crossing(vs_trl_figures.mean_curve(curves), target)
        slow = _slow_mean_crossing(curves, target)
        assert (fast is None) == (slow is None)
        if fast is not None:
            assert abs(fast - slow) <= 0.011
    mean = vs_trl_figures.mean_curve([[(0.0, 0.2), (10.0, 0.4)], [(0.0, 0.0), (5.0, 0.2), (8.0, 0.0)]])
    # up to the shorter run's end, 8 s: (0.36 + 0.0) / 2 there
    assert mean == [(0.0, pytest.approx(0.1)), (5.0, pytest.approx(0.25)), (8.0, pytest.approx(0.18))]
    with pytest.raises(ValueError, match="outside"):
        vs_trl_figures.curve_at([(0.0, 0.1), (5.0, 0.2)], 6.0)


def test_mean_curve_lines_bound_the_ratio_when_trl_never_holds_the_target():
    """TRL touches the target in each seed for one evaluation and falls back (the mean of first
    crossings counts it as reached); its mean curve never reaches it, so arealite's ratio is an
    upper bound, with both sides' times to TRL's mean-curve best beside it."""
    def run(curve):
        return vs_trl_figures.finish({"steps": 10, "train_s": curve[-1][0], "phases": {}, "curve": curve}, 0.5)

    runs = {"trl-1t-s1": run([(0.0, 0.1), (40.0, 0.5), (80.0, 0.1)]),
            "async-s1": run([(0.0, 0.1), (20.0, 0.5), (80.0, 0.5)]),
            "trl-1t-s2": run([(0.0, 0.1), (40.0, 0.1), (80.0, 0.5)]),
            "async-s2": run([(0.0, 0.1), (40.0, 0.5), (80.0, 0.5)])}
    lines = vs_trl_figures.headlines(runs, 0.5)
    mean = next(x for x in lines if x.startswith("arealite async / TRL time to 0.50 held-out right (mean"))
    assert "0.50x (target <= 0.5)" in mean  # (20 + 40) / (40 + 80)
    line = next(x for x in lines if "on the mean curve over seeds 1,2" in x)
    # TRL's mean: 0.1, 0.3 at 40 s, 0.3 at 80 s (best 0.3 from 40 s on); arealite's mean: 0.1,
    # 0.4 at 20 s, 0.5 at 40 s: the target at 40 s of TRL's 80 s, TRL's best at 20 * 2/3 s
    assert line.endswith("0.50x (no target) [an upper bound: TRL's mean curve did not reach it in 80 s, its "
                         "best 0.300 at 40 s; arealite async's reaches that best at 13 s: 0.33x]")
    assert not parse_figures("vs_trl", line)  # no target on it: the page's summary ignores it
    runs["trl-1t-s1"] = run([(0.0, 0.1), (40.0, 0.5), (80.0, 0.5)])  # TRL's mean reaches 0.5 at 80 s
    line = next(x for x in vs_trl_figures.headlines(runs, 0.5) if "on the mean curve" in x)
    assert line.endswith("0.50x (no target) [40 s against 80 s]")
    assert vs_trl_figures.mean_curve_headlines({1: runs}, 0.5) == []  # one seed: nothing to average
