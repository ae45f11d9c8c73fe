"""run_all: which scripts count as benchmarks, and the async-vs-sync section of the results page."""

from __future__ import annotations

from benchmarks.harness import run_all
from benchmarks.harness.paths import results_dir
from benchmarks.harness.report import render_markdown
from benchmarks.harness.rl_metrics import compare, markdown_table, phase_table


def test_discover_lists_the_benchmarks_not_the_helpers():
    names = run_all.discover()
    assert names[:2] == ["server_throughput", "client_overhead"]
    assert "async_vs_sync" in names
    assert not set(names) & run_all.HELPERS


def _summary(wall, reward, hist):
    return {"steps": 10, "wall_s": wall, "tokens_per_s": 1000.0 / wall, "trainer_idle": 0.1,
            "rollout_idle": 0.2, "staleness_hist": hist, "final_reward": reward, "gen_len": 5.0,
            "seq_len_max": 146.0,
            "phases": {"step": wall / 10, "rollout_wait": 0.4, "logp": 0.2, "update": 0.4,
                       "weight_sync": 0.01, "other": 0.0, "trainer": 0.61}}


def test_async_section(tmp_path):
    runs = compare({"sync": _summary(10.0, 0.8, {0: 1.0}),
                    "async-eta4": _summary(7.0, 0.78, {0: 0.2, 4: 0.8}),
                    "async-eta4-naive": _summary(6.0, 0.6, {0: 0.2, 4: 0.8})})
    result = {
        "date": "2026-01-01 00:00", "command": "python -m benchmarks.studies.async_vs_sync",
        "machine": {"cpu": "CPU", "cores": 2, "torch": "2.13", "gpu": None, "python": "3.11", "os": "Linux"},
        "settings": {"steps": 10, "batch_size": 16, "tail_fraction": 0.1, "tail_tokens": 128,
                     "max_tokens_per_mb": 256, "eval_prompts": None},
        "headline": {"run": "async-eta4", "speedup": runs["async-eta4"]["speedup"],
                     "overlap_efficiency": runs["async-eta4"]["overlap_efficiency"]},
        "runs": runs, "table_md": markdown_table(runs), "phases_md": phase_table(runs),
        "machine_use": {"sync": {"load_1m": 1.2, "cores": {"server": 0.3}}},
        "explanation": ["first reason", "second reason"],
    }
    path = results_dir("async_vs_sync") / "async_vs_sync_example.json"
    text = run_all.async_section(result, path)
    assert "`benchmarks/results/async_vs_sync/async_vs_sync_example.json`" in text
    assert "10 steps per run, 16 prompts x 8 samples" in text and "128 tokens past EOS" in text
    assert markdown_table(runs) in text
    assert "Headline: async-eta4 is 1.43x faster than sync" in text
    assert "decoupled loss 0.780 (0.97 of sync), naive PPO 0.600 (0.75 of sync), sync 0.800" in text
    assert "`benchmarks/results/async_vs_sync/async_vs_sync_example.png`" in text
    assert "sync 1.2" in text
    assert text.endswith("- first reason\n- second reason")


def test_missing_entries_point_at_who_prints_the_figures():
    ran = [{"name": n, "notes": ["client_overhead figures follow"] if n == "weight_sync" else []}
           for n in ("server_throughput", "weight_sync", "async_vs_sync", "staleness_ablation",
                     "trainer_step", "vs_trl")]
    (missing,) = run_all.missing_entries(ran)
    assert missing["name"] == "client_overhead" and missing["status"] == "missing"
    assert "weight_sync prints the client_overhead figures" in missing["about"]
    assert run_all.missing_entries(ran + [{"name": "client_overhead", "notes": []}]) == []
    assert len(run_all.missing_entries([])) == len(run_all.KNOWN)


def test_keep_line():
    assert run_all.keep_line("ratio server / static batch  : 1.51x (target >= 1.5x)")
    assert not run_all.keep_line("Loading weights: 100%|####| 27/27 [00:00<00:00, 10558.10it/s]")
    assert not run_all.keep_line("== sync (load average 1.0): arealite train ...")
    assert not run_all.keep_line("   ")


def test_full_run_entry_and_profile_section():
    sync = _summary(10.0, 0.8, {0: 1.0})
    sync["phases"].update(rollout_wait=0.5, trainer=0.7)
    runs = compare({"sync": sync, "async-eta2": _summary(8.0, 0.79, {2: 1.0})})
    r = {"headline": {"run": "async-eta2", "speedup": 1.25, "overlap_efficiency": 0.91,
                      "reward_vs_sync": 0.79 / 0.8},
         "targets": {"speedup": 2.8, "overlap_efficiency": 0.9, "reward_tol": 0.05},
         "settings": {"steps": 200}, "command": "python -m benchmarks.studies.async_vs_sync",
         "date": "2026-01-01 00:00", "runs": runs,
         "trainer_profile": [{"budget": 4096, "logp": 0.5, "update": 1.5, "tokens": 4000},
                             {"budget": 256, "logp": 0.2, "update": 0.5, "tokens": 4000}]}
    e = run_all.full_run_entry(r)
    assert e["name"] == "async_vs_sync, last full run (200 steps)"
    assert [(f["value"], f["met"]) for f in e["figures"]] == [("1.25x", False), ("0.91", True), ("0.988", True)]
    text = run_all.profile_section(r)
    # 2.0 s -> 0.7 s for the profiled batch; the sync trainer phase was 0.7 s, so 2.0 s before
    assert "2.000 s at the main job's budget of 4096 tokens, 0.700 s at 256 (2.86x)" in text
    assert "the sync step drops from about 2.50 s to 1.20 s" in text
    assert "rises from 1.25x to 1.71x" in text
    assert run_all.full_run_entry({"headline": {}}) is None


def test_rerun_of_some_keeps_the_others_and_dates_each():
    def entry(name, value, **kw):
        return {"name": name, "command": f"python -m benchmarks.{name} --quick", "status": "ok",
                "seconds": 3.0, "notes": [], "about": "",
                "figures": [{"name": "ratio", "value": value, "target": "<= 1", "met": False}], **kw}

    last = {"date": "2026-01-01 00:00", "command": "make bench",
            "results": [entry("a", "2x"), entry("b", "3x"),
                        {**entry("gone", "-"), "status": "missing", "figures": []}]}
    merged = run_all.merge_rerun(last, [entry("b", "0.9x"), entry("new", "1x")], "2026-01-02 10:00")
    assert [(r["name"], r["figures"][0]["value"], r["date"]) for r in merged] == [
        ("a", "2x", "2026-01-01 00:00"), ("b", "0.9x", "2026-01-02 10:00"),
        ("new", "1x", "2026-01-02 10:00")]
    machine = {"cpu": "CPU", "cores": 2, "torch": "2.13", "gpu": None, "python": "3.11", "os": "Linux"}
    page = render_markdown(merged, machine, "make bench", [], last["date"])
    assert "rerun on 2026-01-02 10:00" in page and page.count("rerun on") == 2
