"""A shortened main job, end to end: SFT warm start, embedded server, async GRPO over the
launcher, weights broadcast over gloo every step (ARCHITECTURE invariants 1, 2 and 4)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from tests.support.procs import log_tail, spawn

ROOT = Path(__file__).parents[2]
ETA = 2
STEPS = 120


def _metrics(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.integration
@pytest.mark.long
def test_short_main_job(tmp_path, toy_assets):
    (tmp_path / "assets").symlink_to(toy_assets)  # the session's SFT warm start, built once
    cmd = [
        sys.executable, "-m", "arealite.cli.main", "main-job", f"cluster.fileroot={tmp_path}",
        f"total_train_steps={STEPS}", "evaluator.freq_steps=30", "trial_name=e2e",
        f"rollout.max_head_offpolicyness={ETA}",
        # the main job's cosine spans its 374 steps; cut short it decays to 0.2x by the end and
        # learns less (0.34 -> 0.44 once in CI): hold the lr of the main job's first steps
        "actor.optimizer.lr_scheduler_type=constant",
    ]
    with spawn(cmd) as (proc, log):
        t0 = time.monotonic()
        while proc.poll() is None and time.monotonic() - t0 < 540:
            time.sleep(1)
        assert proc.poll() == 0, f"main job failed or timed out:\n{log_tail(log, 60)}"
        out = log_tail(log, 12)
    run = tmp_path / "toy-grpo" / "e2e"
    rows = _metrics(run / "logs" / "metrics.jsonl")
    steps = [r for r in rows if r["step"] >= 1]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    assert (run / "reward_curve.png").is_file() and (run / "logs" / "tensorboard").is_dir()
    assert "reward curve" in out

    # Invariant 1: no trained token is more than eta versions behind the weights it trains.
    assert max(r["staleness/max"] for r in steps) <= ETA

    # Invariant 4: at the first step servers and trainer hold identical weights, so the
    # behaviour logprobs equal the recomputed ones and the policy ratio is exactly 1.
    first = steps[0]
    assert first["logprob_agreement/n_tokens"] > 100
    # fp32, two attention kernels (the server's and the trainer's per-sequence one): ~1e-5
    assert first["logprob_agreement/max_abs_diff"] < 5e-5
    assert abs(first["approx_kl/avg"]) < 1e-6

    # Learning: greedy held-out mean reward (eval/score; the toy reward pays 1 for a right
    # "#### N" and 0 otherwise, so it is also the exact share) rises over the SFT start (0.535; 200 prompts, so one
    # evaluation's paired difference has a standard error of ~0.035 and +0.05 is the bar), and
    # the sampled training reward of the last third beats the first third. The bar is on the
    # mean of the evaluations of the run's second half (steps 60, 90, 120): the first ones can
    # dip below the start while the sampled reward already rises (0.425 at step 45 in one CI
    # run; 0.415-0.475 at steps 20-40 in 7 of 27 runs here), and one evaluation alone moves by
    # +-0.05 from run to run (step 90: 0.58-0.71). Measured on 14 runs with evaluations every 30
    # steps, two at a time on 2 cores (2026-11-28; 6 of them ran on to step 150): that mean was
    # 0.632-0.697 (mean 0.659, sd 0.017); in the 8 runs of exactly this command the sampled
    # reward went 0.22-0.25 (first third) -> 0.32-0.36 (last third). The median, not the mean,
    # of the three: one dip still comes late (a quiet clean-clone CI run: 0.43, 0.625, 0.665 at
    # steps 60, 90, 120, mean 0.573 under the 0.585 bar); two of three must clear it.
    evals = {r["step"]: r["eval/score"] for r in rows if "eval/score" in r}
    second_half = sorted(a for step, a in evals.items() if step >= STEPS // 2)
    assert len(second_half) == 3 and second_half[1] > evals[0] + 0.05, evals
    third = STEPS // 3
    early = sum(r["reward"] for r in steps[:third]) / third
    late = sum(r["reward"] for r in steps[-third:]) / third
    assert late > early + 0.03, (early, late)


def test_sft_prefixed_overrides_go_to_the_warm_start():
    from arealite.demo.main_job import split_sft_overrides

    grpo, sft = split_sft_overrides(["total_train_steps=5", "sft.total_train_steps=7",
                                     "sft.evaluator.freq_steps=10", "actor.path=x"])
    assert grpo == ["total_train_steps=5", "actor.path=x"]
    assert sft == ["total_train_steps=7", "evaluator.freq_steps=10"]
    assert split_sft_overrides(None) == ([], [])


def test_a_deleted_warm_start_is_rebuilt_over_its_stale_trial(tmp_path, capsys):
    """#37: deleting outputs/assets/sft_model (to rebuild it) must not leave `make run` refused
    for good by the warm-start trial the first build left: that trial only builds the asset."""
    from arealite.demo.main_job import SFT_CONFIG, warm_start_args
    from arealite.launcher.local import main as launch
    from tests.support.min_assets import min_assets

    over = min_assets(tmp_path, "model.path")
    stale = tmp_path / "out" / "toy-sft" / "warm-start" / "logs"
    stale.mkdir(parents=True)
    (stale / "metrics.jsonl").write_text('{"step": 0}\n')
    args = warm_start_args(tmp_path / "out" / "assets" / "sft_model",
                           [str(ROOT / SFT_CONFIG), *over])
    assert launch([*args, "--dry-run"]) == 0
    assert "toy-sft/warm-start: overwrite" in capsys.readouterr().out


def test_a_reused_warm_start_built_otherwise_says_so(tmp_path, capsys):
    """A job whose `sft.` overrides differ from the warm start's on disk reuses it (an asset
    is written once) and says with what it was built, so a figure that differs is explained."""
    from arealite.demo.main_job import ensure_sft

    model = tmp_path / "sft_model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (tmp_path / "sft_model.args").write_text("cfg.yaml\ntotal_train_steps=100\n")
    assert ensure_sft(model, ["cfg.yaml"]) == 0
    out = capsys.readouterr().out
    assert f"reusing {model}, built with total_train_steps=100 (delete {model}" in out
    assert ensure_sft(model, ["cfg.yaml", "total_train_steps=100"]) == 0
    assert capsys.readouterr().out.strip() == f"== 2/3 SFT warm start: reusing {model}"
