"""docs/own_task.md, run as written (#28): the files of examples/own_task copied to a folder
outside the repository, a model built there, then a time-capped GRPO run with the user's own
reward, grader (eval_fn) and typed options, using only the installed package."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.procs import kill_group

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "examples" / "own_task"
BUDGET_S = 12.0


def _arealite(args: list[str], cwd: Path, timeout: float) -> tuple[int, str]:
    """The installed ``arealite`` command in ``cwd``, with nothing of the repo on the path."""
    exe = Path(sys.executable).with_name("arealite")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.Popen([str(exe), *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, _ = proc.communicate()
        pytest.fail(f"arealite {' '.join(args)} timed out:\n{out[-4000:]}")
    return proc.returncode, out


def test_walkthrough_lists_the_example_files():
    """The walk-through names every file it ships, and every file it names exists."""
    doc = (ROOT / "docs" / "own_task.md").read_text()
    shipped = sorted(p.name for p in EXAMPLE.iterdir() if p.is_file() and p.name != ".gitignore")
    for name in shipped:
        assert name in doc, f"docs/own_task.md does not mention examples/own_task/{name}"
    for key in ("total_train_seconds", "eval_fn", "extra_schema", "lr_scheduler_type",
                "group_size", "max_head_offpolicyness", "arealite plot"):
        assert key in doc, key


@pytest.mark.integration
@pytest.mark.long
def test_own_task_trains_from_a_folder_outside_the_repo(tmp_path):
    work = tmp_path / "my_task"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("model", "outputs", "__pycache__"))
    assert not str(work).startswith(str(ROOT))
    code, out = _arealite(["tiny-model", "--out", "model"], work, 120)
    assert code == 0, out

    # Our own options are checked like ours: a typo is one line and exit 2.
    code, out = _arealite(["train", "own_task.yaml", "extra.eval_row=3", "--dry-run"], work, 60)
    assert code == 2 and "unknown key 'extra.eval_row' (did you mean: eval_rows?)" in out

    code, out = _arealite(["train", "own_task.yaml", f"total_train_seconds={BUDGET_S}",
                           "evaluator.freq_steps=4", "extra.eval_rows=16", "trial_name=t"],
                          work, 240)
    assert code == 0, out[-4000:]
    run = work / "outputs" / "own-task" / "t"
    rows = [json.loads(line) for line in (run / "logs" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] >= 1]
    last = steps[-1]
    # The time budget ended the run (the epochs would take thousands of steps) right after the
    # step that used it up, counting training time only.
    assert 3 <= len(steps) < 1000
    assert BUDGET_S <= last["timeperf/train_elapsed"] < BUDGET_S + 10
    assert all(r["timeperf/train_elapsed"] < BUDGET_S for r in steps[:-1])
    # The user's grader ran at step 0, every 4 steps and at the end, timed apart.
    evals = [r for r in rows if "eval/accuracy" in r]
    assert [r["step"] for r in evals][:2] == [0, 4] and evals[-1]["step"] == last["step"]
    assert all(r["eval/n"] == 16 and r["timeperf/eval"] > 0 for r in evals)
    assert all("reward" in r and "timeperf/weight_upload" in r for r in steps)
    # A trained model, and a reward curve.
    assert (run / "checkpoints" / f"step{last['step']}" / "config.json").is_file()
    code, out = _arealite(["plot", str(run / "logs" / "metrics.jsonl"), "--out", "curve.png"], work, 60)
    assert code == 0 and (work / "curve.png").stat().st_size > 0
    # One line per step from the trainer: no line per weight upload or per stale drop.
    log = (run / "logs" / "trainer.log").read_text()
    assert "uploaded weights" not in log and "dropped a trajectory" not in log


@pytest.mark.integration
def test_time_budget_and_eval_agree_across_two_trainer_ranks(tmp_path):
    """Rank 0's clock decides when to stop and evaluate, and every rank drains for the
    evaluation: two ranks neither hang nor part ways."""
    work = tmp_path / "my_task"
    shutil.copytree(EXAMPLE, work, ignore=shutil.ignore_patterns("model", "outputs", "__pycache__"))
    code, out = _arealite(["tiny-model", "--out", "model"], work, 120)
    assert code == 0, out
    code, out = _arealite(["train", "own_task.yaml", "total_train_seconds=6", "evaluator.freq_steps=2",
                           "extra.eval_rows=8", "launcher.trainer_nproc=2", "trial_name=t2"], work, 240)
    assert code == 0, out[-4000:]
    rows = [json.loads(line) for line in
            (work / "outputs" / "own-task" / "t2" / "logs" / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    assert last["timeperf/train_elapsed"] >= 6 and "eval/accuracy" in last
