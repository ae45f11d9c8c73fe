"""benchmarks/studies/staleness_ablation.py: the statistics over seeds, the verdict, and its results-page
entry (the runs themselves are the async_vs_sync runs, smoke-tested there)."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from benchmarks.harness import run_all
from benchmarks.studies import staleness_ablation


def test_mean_se_against_the_textbook_formula():
    xs = [0.8, 0.7, 0.9, 0.6]
    m, se = staleness_ablation.mean_se(xs)
    mean = sum(xs) / len(xs)
    var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
    assert m == pytest.approx(mean) and se == pytest.approx(math.sqrt(var / len(xs)))
    assert staleness_ablation.mean_se([0.5]) == (0.5, 0.0)


def _runs(finals: dict[str, list[float]]) -> dict[str, dict[int, dict]]:
    # the training reward of the last steps: the held-out one minus a fixed 0.2
    return {cfg: {s + 1: {"final_reward": v, "train_reward_last": v - 0.2, "clip_ratio": 0.1,
                          "behave_kl": 0.01}
                  for s, v in enumerate(vals)} for cfg, vals in finals.items()}


def _args(tmp_path, seeds) -> argparse.Namespace:
    return argparse.Namespace(eta=4, ppo_minibatches=4, steps=200, seeds=seeds, quick=False,
                              eval_prompts=None, lr=None, argv=[], results_dir=str(tmp_path))


@pytest.mark.parametrize("naive, verdict", [
    ([0.60, 0.62, 0.58], "reproduced"),          # far below the decoupled loss
    ([0.80, 0.79, 0.81], "not resolved"),        # within noise
    ([0.95, 0.97, 0.96], "reversed"),            # far above
])
def test_verdict_follows_two_standard_errors(tmp_path, capsys, naive, verdict):
    runs = _runs({"sync": [0.82, 0.80, 0.81], "decoupled": [0.80, 0.81, 0.79], "naive": naive})
    res = staleness_ablation.report(_args(tmp_path, [1, 2, 3]), runs, "_t")
    assert res["verdict"].startswith(verdict)
    # a shift common to every run changes neither the gap nor the verdict on the training reward
    assert res["verdict_train"] == res["verdict"]
    assert res["decoupled_minus_naive_train"] == pytest.approx(res["decoupled_minus_naive"])
    assert res["train_reward"]["sync"]["mean"] == pytest.approx(0.81 - 0.2)
    assert res["relative_to_sync"]["decoupled"] == pytest.approx(0.80 / 0.81)
    assert json.loads((tmp_path / "staleness_ablation_t.json").read_text())["verdict"] == res["verdict"]
    out = capsys.readouterr().out
    assert "decoupled loss at eta=4, final reward / sync: 0.988 (target >= 0.95)" in out


def test_one_seed_tests_nothing(tmp_path, capsys):
    runs = _runs({"sync": [0.8], "decoupled": [0.5], "naive": [0.9]})
    res = staleness_ablation.report(_args(tmp_path, [1]), runs, "_t")
    assert res["verdict"].startswith("not tested")
    # no "(target ...)" line: the results page takes no figure from a smoke run
    assert run_all.parse_figures("staleness_ablation", capsys.readouterr().out) == []


def test_results_page_entry(tmp_path):
    runs = _runs({"sync": [0.82, 0.80, 0.81], "decoupled": [0.70, 0.71, 0.69],
                  "naive": [0.80, 0.79, 0.81]})
    res = staleness_ablation.report(_args(tmp_path, [1, 2, 3]), runs, "_t")
    entry = run_all.ablation_full_entry(res)
    (fig,) = entry["figures"]
    assert fig["met"] is False and fig["value"] == f"{0.70 / 0.81:.3f}"
    assert "reversed" in entry["about"] and "3 seeds" in entry["name"]


def test_resume_keeps_runs_of_the_same_settings_only(tmp_path, capsys):
    runs = _runs({"sync": [0.82, 0.80], "decoupled": [0.80, 0.81], "naive": [0.6, 0.7]})
    staleness_ablation.report(_args(tmp_path, [1, 2]), runs, "")
    path = tmp_path / "staleness_ablation.json"
    kept = staleness_ablation.resumable_runs(path, _args(tmp_path, [2, 3]))
    # seed 2 comes back for every configuration; seed 1 was not asked for, seed 3 never ran
    assert {c: sorted(v) for c, v in kept.items()} == {c: [2] for c in staleness_ablation.CONFIGS}
    assert kept["naive"][2]["final_reward"] == 0.7
    other = _args(tmp_path, [1, 2])
    other.lr = 1e-4  # a different learning rate: nothing is comparable
    assert staleness_ablation.resumable_runs(path, other) == {c: {} for c in staleness_ablation.CONFIGS}
    assert "other lr" in capsys.readouterr().out


def test_results_page_entry_lists_every_seed(tmp_path):
    runs = _runs({"sync": [0.82, 0.80, 0.81], "decoupled": [0.70, 0.71, 0.69],
                  "naive": [0.60, 0.59, 0.61]})
    entry = run_all.ablation_full_entry(staleness_ablation.report(_args(tmp_path, [1, 2, 3]), runs, ""))
    assert [n.split(":")[0] for n in entry["notes"]] == ["sync", "decoupled", "naive"]
    assert "0.700 0.710 0.690" in entry["notes"][1]
    assert "training reward" in entry["about"] and "Behaviour KL" in entry["about"]


def test_recorded_command_keeps_only_what_decides_the_runs():
    argv = ["--lr", "1e-4", "--results-dir", "/tmp/x", "--seeds", "1,2", "--resume",
            "--results-dir=/tmp/y"]
    assert staleness_ablation.reproducing_argv(argv) == ["--lr", "1e-4", "--seeds", "1,2"]


def test_page_entry_names_its_learning_rate(tmp_path):
    runs = _runs({"sync": [0.82, 0.80, 0.81], "decoupled": [0.80, 0.81, 0.79],
                  "naive": [0.60, 0.59, 0.61]})
    a = _args(tmp_path, [1, 2, 3])
    assert "the main job's lr" in run_all.ablation_full_entry(staleness_ablation.report(a, runs, ""))["name"]
    a.lr = 1e-4
    assert "lr 0.0001" in run_all.ablation_full_entry(staleness_ablation.report(a, runs, ""))["name"]


def test_variant_arms_run_with_their_overrides_and_get_their_own_file(tmp_path, capsys):
    a = staleness_ablation.parse_args([
        "--seeds", "1,2", "--arms", "icepop,lrhalf", "--results-dir", str(tmp_path),
        "--variant", "icepop:actor.behav_imp_weight_floor=0.5, actor.behav_imp_weight_cap=2",
        "--variant", "lrhalf:actor.optimizer.lr=1e-4"])
    assert a.arms == ["sync", "icepop", "lrhalf"]  # sync always runs, first
    assert a.variants == {"icepop": ["actor.behav_imp_weight_floor=0.5",
                                     "actor.behav_imp_weight_cap=2"],
                          "lrhalf": ["actor.optimizer.lr=1e-4"]}
    runs = _runs({"sync": [0.80, 0.90], "icepop": [0.78, 0.88], "lrhalf": [0.60, 0.70]})
    res = staleness_ablation.report(a, runs, "_sync-icepop-lrhalf")
    assert res["relative_to_sync"] == pytest.approx({"icepop": 1.66 / 1.70, "lrhalf": 1.30 / 1.70})
    assert res["verdict"] == "not run"  # no decoupled/naive pair to compare
    out = capsys.readouterr().out
    assert "variant icepop at eta=4, final reward / sync: 0.976 (target >= 0.95)" in out
    # --resume keeps these runs only for the same variant definitions
    path = tmp_path / "staleness_ablation_sync-icepop-lrhalf.json"
    assert sorted(staleness_ablation.resumable_runs(path, a)["icepop"]) == [1, 2]
    a.variants = {**a.variants, "lrhalf": ["actor.optimizer.lr=5e-5"]}
    assert staleness_ablation.resumable_runs(path, a)["lrhalf"] == {}


@pytest.mark.parametrize("argv", [
    ["--variant", "icepop"],                        # no overrides
    ["--variant", "naive:actor.c_clip=3"],          # a built-in arm's name
    ["--variant", "x:=1"],                          # no key
    ["--arms", "sync,unknown"],                     # an arm nobody defined
])
def test_malformed_variants_and_arms_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        staleness_ablation.parse_args(argv)
    assert e.value.code == 2 and "error:" in capsys.readouterr().err


def test_results_page_entry_of_a_variant_file(tmp_path):
    a = staleness_ablation.parse_args(["--seeds", "1,2", "--arms", "capped", "--results-dir",
                                       str(tmp_path), "--variant", "capped:actor.behav_imp_weight_cap=2"])
    runs = _runs({"sync": [0.80, 0.90], "capped": [0.70, 0.80]})
    entry = run_all.ablation_full_entry(staleness_ablation.report(a, runs, "_sync-capped"))
    (fig,) = entry["figures"]
    assert fig["name"] == "variant capped at eta=4, final reward / sync"
    assert fig["value"] == f"{1.5 / 1.7:.3f}" and fig["met"] is False
    assert "actor.behav_imp_weight_cap=2" in entry["about"] and "arms sync, capped" in entry["name"]
    assert "Naive PPO" not in entry["about"]  # no naive arm ran


def test_progress_saved_after_each_run_resumes(tmp_path):
    a = staleness_ablation.parse_args(["--seeds", "1,2", "--arms", "capped", "--results-dir",
                                       str(tmp_path), "--variant", "capped:actor.behav_imp_weight_cap=2"])
    runs = _runs({"sync": [0.80], "capped": [0.70]})
    runs["sync"][2] = dict(runs["sync"][1], final_reward=0.9)  # seed 2: sync done, capped not yet
    staleness_ablation.save_progress(a, runs, "_sync-capped")
    kept = staleness_ablation.resumable_runs(tmp_path / "staleness_ablation_sync-capped.json", a)
    assert {c: sorted(v) for c, v in kept.items()} == {"sync": [1, 2], "capped": [1]}
    assert kept["sync"][2]["final_reward"] == 0.9


def test_resume_from_another_variant_file_keeps_its_sync_runs_only(tmp_path):
    old = staleness_ablation.parse_args(["--seeds", "1,2", "--arms", "capped", "--results-dir",
                                         str(tmp_path), "--variant", "capped:actor.behav_imp_weight_cap=2"])
    staleness_ablation.save_progress(old, _runs({"sync": [0.8, 0.9], "capped": [0.7, 0.6]}),
                                     "_sync-capped")
    new = staleness_ablation.parse_args(["--seeds", "1,2", "--arms", "capped", "--results-dir",
                                         str(tmp_path), "--variant", "capped:actor.optimizer.lr=1e-4"])
    kept = staleness_ablation.resumable_runs(tmp_path / "staleness_ablation_sync-capped.json", new)
    # sync is the same arm; "capped" now names another variant, so its runs are not comparable
    assert {c: sorted(v) for c, v in kept.items()} == {"sync": [1, 2], "capped": []}


def test_report_counts_only_the_seeds_every_arm_finished(tmp_path, capsys):
    runs = _runs({"sync": [0.80, 0.90, 0.70], "decoupled": [0.78, 0.88], "naive": [0.5, 0.6]})
    res = staleness_ablation.report(_args(tmp_path, [1, 2, 3]), runs, "_t")
    assert res["summary"]["sync"]["finals"] == [0.80, 0.90]  # seed 3 has only its sync run
    assert "seeds [1, 2]" in capsys.readouterr().out


def test_one_seed_variant_file_gives_no_page_entry(tmp_path):
    a = staleness_ablation.parse_args(["--seeds", "5", "--arms", "capped", "--results-dir",
                                       str(tmp_path), "--variant", "capped:actor.behav_imp_weight_cap=2"])
    res = staleness_ablation.report(a, _runs({"sync": [0.9], "capped": [0.1]}), "_sync-capped")
    assert run_all.ablation_full_entry(res) is None  # a smoke run: no row without a figure
    a.seeds = [5, 6]
    res = staleness_ablation.report(a, _runs({"sync": [0.9, 0.8], "capped": [0.1, 0.2]}), "_sync-capped")
    assert [f["value"] for f in run_all.ablation_full_entry(res)["figures"]] == [f"{0.3 / 1.7:.3f}"]


def test_each_eta_minibatch_and_step_count_gets_its_own_results_file(tmp_path):
    def tag(*argv: str) -> str:
        return staleness_ablation.results_tag(staleness_ablation.parse_args([*argv]))

    assert tag() == ""  # the default: 4 minibatches, the three arms
    assert tag("--ppo-minibatches", "4", "--lr", "1e-4") == "_lr0.0001"
    # the main job's single minibatch never shares (or, on --resume, restarts) a 4-minibatch file
    assert tag("--ppo-minibatches", "1", "--arms", "decoupled") == "_mb1_sync-decoupled"
    assert tag("--ppo-minibatches", "1", "--quick") == "_quick_mb1"
    # the main job's length (374 steps) beside the 200-step runs, not over them
    assert tag("--ppo-minibatches", "1", "--steps", "374", "--arms", "decoupled") == \
        "_mb1_steps374_sync-decoupled"
    assert tag("--steps", "200") == "" and tag("--quick", "--steps", "8") == "_quick"
    assert tag("--eta", "2", "--ppo-minibatches", "1") == "_eta2_mb1"


def test_length_ratio_reported_only_when_every_run_has_it(tmp_path, capsys):
    runs = _runs({"sync": [0.80, 0.90], "decoupled": [0.78, 0.88]})
    for cfg, vals in {"sync": [1.0, 1.0], "decoupled": [0.99, 1.01]}.items():
        for seed, v in zip((1, 2), vals):
            runs[cfg][seed]["length_ratio"] = v
    a = staleness_ablation.parse_args(["--seeds", "1,2", "--arms", "decoupled", "--results-dir",
                                       str(tmp_path)])
    res = staleness_ablation.report(a, runs, "_sync-decoupled")
    assert res["summary"]["decoupled"]["length_ratio"] == pytest.approx(1.0)
    assert "decoupled 1.000 (seeds 0.990-1.010)" in capsys.readouterr().out
    del runs["decoupled"][2]["length_ratio"]  # a run recorded before the figure existed
    res = staleness_ablation.report(a, runs, "_sync-decoupled")
    assert res["summary"]["decoupled"]["length_ratio"] is None
    assert "trained / generated" not in capsys.readouterr().out


def test_results_page_entry_of_a_sync_decoupled_file(tmp_path):
    a = staleness_ablation.parse_args(["--seeds", "1,2", "--arms", "decoupled", "--ppo-minibatches",
                                       "1", "--results-dir", str(tmp_path)])
    res = staleness_ablation.report(a, _runs({"sync": [0.80, 0.90], "decoupled": [0.82, 0.88]}),
                                    "_mb1_sync-decoupled")
    entry = run_all.ablation_full_entry(res)
    assert "1 minibatches" in entry["name"] and entry["figures"][0]["met"] is True
    # no naive arm and no variant: the text starts with the behaviour KL sentence
    assert entry["about"].startswith("Behaviour KL") and "Naive PPO" not in entry["about"]
