"""benchmarks/studies/vs_trl.py: its arguments, arealite's command line, a run in parts (the runs
themselves replaced); and benchmarks/studies/trl_grpo.py's reward adapters. No real run: the
runs need TRL's virtualenv (``make setup-trl``) and minutes of training."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from benchmarks.studies import trl_grpo, vs_trl, vs_trl_figures


def test_args_quick_defaults_and_errors():
    a = vs_trl.parse_args(["--quick"])
    assert (a.seconds, a.target, a.systems) == (60.0, 0.5, ["trl", "async", "sync"])
    a = vs_trl.parse_args(["--seconds", "120", "--target", "0.85", "--systems", "trl,async"])
    assert (a.seconds, a.target, a.systems) == (120.0, 0.85, ["trl", "async"])
    for bad in (["--systems", "trl,vllm"], ["--target", "1.5"], ["--seconds", "0"], ["--systems", ","]):
        with pytest.raises(SystemExit) as e:
            vs_trl.parse_args(bad)
        assert e.value.code == 2


def test_trl_reward_adapter_uses_the_toy_grader():
    completions = [[{"role": "assistant", "content": "#### 64"}], [{"role": "assistant", "content": "#### 6"}], "#### 7"]
    assert trl_grpo.toy_reward_trl([], completions, answer=["#### 64", "#### 64", "#### 7"]) == [1.0, 0.0, 1.0]
    assert trl_grpo.as_prompt({"question": "What is 1 + 2?"}) == [{"role": "user", "content": "What is 1 + 2?"}]


def test_trl_thread_counts_are_a_sorted_set_of_positive_integers():
    assert vs_trl.parse_args(["--trl-threads", "2,1,2"]).trl_threads == [1, 2]
    for bad in (["--trl-threads", "x"], ["--trl-threads", "0"]):
        with pytest.raises(SystemExit):
            vs_trl.parse_args(bad)


def test_arealite_argv_shares_the_shape_and_seed_and_skips_recovery_checkpoints(tmp_path):
    a = vs_trl.parse_args(["--seconds", "30", "--seeds", "3,2", "--override", "recover.freq_steps=5"])
    assert a.seeds == [2, 3] and vs_trl.parse_args([]).seeds == [1]
    with pytest.raises(SystemExit):
        vs_trl.parse_args(["--seeds", "a"])
    argv = vs_trl.arealite_argv("async", a, tmp_path / "m", tmp_path / "d", "exp", 750, 3, "async-s3")
    assert argv[0] == str(vs_trl.CONFIGS["async"]) and "total_train_seconds=30.0" in argv
    assert {"seed=3", "servers.random_seed=3", "trial_name=async-s3", "gconfig.n_samples=8",
            "gconfig.max_new_tokens=5", "actor.optimizer.lr=0.0002", "total_train_steps=750"} <= set(argv)
    # arealite's algorithm choices for the comparison, before the overrides (which win)
    assert "actor.adv_estimator=grpo" in vs_trl.ALGORITHM
    assert argv[-1 - len(vs_trl.ALGORITHM):-1] == vs_trl.ALGORITHM
    # TRL saves nothing: no recovery checkpoint on arealite's training clock, unless overridden
    assert argv.index("recover.freq_steps=null") < argv.index("recover.freq_steps=5") == len(argv) - 1
    # weight pushes pause generation in place (no abort and re-prefill)
    assert "rollout.pause_mode=in_place" in argv


def test_the_real_job_runs_its_config_sync_twin_and_grader(tmp_path, tiny_tokenizer):
    pytest.importorskip("reasoning_gym")
    from arealite.dataset.reasoning_gym import TaskSpec, build_rows
    from workflows.prompting import encode_prompt

    a = vs_trl.parse_args(["--job", "real"])
    sync = vs_trl.arealite_argv("sync", a, tmp_path / "m", tmp_path / "d", "exp", 10, 1)
    asyn = vs_trl.arealite_argv("async", a, tmp_path / "m", tmp_path / "d", "exp", 10, 1)
    assert sync[0] == asyn[0] == str(vs_trl.REAL_CONFIG)
    assert set(vs_trl.REAL_SYNC) <= set(sync) and not set(vs_trl.REAL_SYNC) & set(asyn)
    # TRL's side: the row's conversation with the prefill continued. TRL renders a conversational
    # prompt with a new assistant turn always, so the prefilled row goes as text whose tokens
    # (TRL tokenizes plain prompts with the tokenizer's call) are the ones arealite generates from
    (row,) = build_rows([TaskSpec("gcd")], 1, seed=0, split="valid", answer_prefix="<answer>")
    assert row["messages"][-1] == {"role": "assistant", "content": "<answer>"}
    col = trl_grpo.as_column_row("rg", row, tiny_tokenizer)
    assert isinstance(col["prompt"], str) and col["prompt"].endswith("<answer>")
    assert tiny_tokenizer(text=[col["prompt"]])["input_ids"][0] == encode_prompt(tiny_tokenizer, row)[0]
    # a row with no prefill stays a conversation
    plain = trl_grpo.as_column_row("rg", {**row, "messages": row["messages"][:-1]}, tiny_tokenizer)
    assert plain["prompt"] == row["messages"][:-1]
    # TRL hands the reward plain-text completions of a text prompt: paid as arealite pays them,
    # the prefill read from the row's conversation
    reward = trl_grpo.reward_fn("rg")
    right = f"{row['answer']}</answer>"
    got = reward([col["prompt"]] * 3, [right, [{"role": "assistant", "content": right}], "zz"],
                 **{k: [v] * 3 for k, v in col.items() if k != "prompt"})
    assert got == [1.0, 1.0, 0.0]


def test_a_run_in_parts_keeps_finished_arms_and_reruns_the_rest(tmp_path, monkeypatch, capsys):
    """--max-arms stops with exit 3 naming what is left; --resume reuses the arms measured with
    the same arguments and reruns an arm measured under others."""
    from benchmarks.harness import warm_start

    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text("{}\n" * 64)
    monkeypatch.setattr(warm_start, "ensure_model", lambda root: (tmp_path / "model", data))
    monkeypatch.setattr(vs_trl, "RESULTS", tmp_path / "results")
    monkeypatch.setattr(vs_trl, "plot", lambda *args: None)
    ran: list[str] = []

    def fake(name, seed, a, experiment):
        ran.append(f"{name}-s{seed}")
        (Path(a.fileroot) / experiment / vs_trl_figures.run_key(name, seed, a.seeds)).mkdir(parents=True, exist_ok=True)
        return vs_trl_figures.finish({"steps": 4, "train_s": 40.0 + seed, "curve": [(0.0, 0.1), (20.0, 0.6)],
                              "phases": {}}, a.target)

    monkeypatch.setattr(vs_trl, "run_trl", lambda a, m, d, e, ms, th, seed: fake(f"trl-{th}t", seed, a, e))
    monkeypatch.setattr(vs_trl, "run_arealite", lambda name, a, m, d, e, ms, seed: fake(name, seed, a, e))
    argv = ["--systems", "trl,async", "--seeds", "1,2", "--trl-threads", "2", "--seconds", "40",
            "--target", "0.5", "--fileroot", str(tmp_path / "out"), "--tag", "t"]
    trl_python = ["--trl-python", sys.executable]

    assert vs_trl.main([*argv, *trl_python, "--max-arms", "3"]) == 3
    assert ran == ["trl-2t-s1", "async-s1", "trl-2t-s2"]
    got = capsys.readouterr()
    assert "left: async-s2; run the same command with --resume" in got.err
    # the part's report: its arms' table, and the ratio lines of the seed it finished only
    assert "| TRL GRPOTrainer, 2 threads, seed 2 |" in got.out
    assert "seed 1: arealite async / TRL seconds per step: 1.00x (no target)" in got.out
    assert "seed 2: arealite" not in got.out
    assert not (tmp_path / "results" / "vs_trl_t.json").exists()

    ran.clear()
    assert vs_trl.main([*argv, *trl_python, "--resume"]) == 0
    assert ran == ["async-s2"]
    out = json.loads((tmp_path / "results" / "vs_trl_t.json").read_text())
    assert sorted(out["runs"]) == ["async-s1", "async-s2", "trl-2t-s1", "trl-2t-s2"]
    assert set(out["arms"]["async-s1"]) == {"date", "commit", "load_average", "load_during"}
    during = out["arms"]["async-s1"]["load_during"]  # sampled at the arm's start and end at least
    assert during["samples"] >= 2 and during["max"] >= during["mean"]
    assert out["runs"]["trl-2t-s2"]["train_s"] == 42.0

    ran.clear()  # --max-arms 0: the report of what is kept, nothing run
    assert vs_trl.main([*argv, *trl_python, "--resume", "--max-arms", "0"]) == 0
    assert ran == [] and "seed 2: arealite async / TRL seconds per step" in capsys.readouterr().out

    ran.clear()  # other figures-affecting arguments: nothing is kept
    assert vs_trl.main([*argv, "--seconds", "50", *trl_python, "--resume"]) == 0  # the last --seconds wins
    assert ran == ["trl-2t-s1", "async-s1", "trl-2t-s2", "async-s2"]
