"""The device check's CPU form: its parts run here as they will on a lent GPU (device info, the
CUDA tests, which skip, and the server's decode table); a part that overruns its limit is
killed without losing the others; the co-located part's figures from a run's metrics; the
wheels pinned to the versions this repository runs. The co-located part runs the main job with
``launcher.colocate=true``, which ``tests/trainer/test_colocated_job.py`` runs in ``make test``."""

from __future__ import annotations

import json
import sys
import time
from importlib.metadata import version

import pytest

from benchmarks.gpu_check import prepare, run
from benchmarks.gpu_check.colocated import summarize


@pytest.mark.integration
def test_cpu_form_runs_its_parts_and_writes_one_results_file(tmp_path):
    parts = "device_info,cuda_tests,decode"
    assert run.main(["--device", "cpu", "--quick", "--parts", parts, "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "gpu_check.json").read_text())
    assert set(res["parts"]) == set(parts.split(","))
    assert all(p["status"] == "ok" for p in res["parts"].values()), res
    tests = res["parts"]["cuda_tests"]["figures"]
    assert tests["tests"] >= 5 and tests["skipped"] == tests["tests"]  # no CUDA here
    rows = res["parts"]["decode"]["figures"]["rows"]
    assert [r["batch"] for r in rows] == [1, 16, 64]
    assert all(
        r["server_tok_s"] > 0 and r["hf_static_tok_s"] > 0 and 0 < r["server_share_of_bound"] < 1
        for r in rows
    ), rows
    log = (tmp_path / "gpu_check.log").read_text()
    assert "===== decode: ok" in log and "skipped" in log


class _Sleeper(run.Part):
    def command(self, device, quick, work):
        if self.name == "hangs":
            return [sys.executable, "-c", "import time; time.sleep(120)"]
        return [
            sys.executable,
            "-c",
            f"import json; json.dump({{'x': 1}}, open(r'{work}/after.json', 'w'))",
        ]


def test_a_part_past_its_limit_is_killed_and_the_next_still_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(run, "PARTS", [_Sleeper("hangs", 3, 3), _Sleeper("after", 60, 60)])
    t0 = time.monotonic()
    assert run.main(["--device", "cpu", "--parts", "hangs,after", "--out", str(tmp_path)]) == 1
    assert time.monotonic() - t0 < 60
    res = json.loads((tmp_path / "gpu_check.json").read_text())["parts"]
    assert res["hangs"]["status"] == "timeout" and res["after"] == {
        **res["after"],
        "status": "ok",
        "figures": {"x": 1},
    }
    assert run.main(["--device", "cpu", "--parts", "nope"]) == 2


def test_a_part_is_skipped_when_the_budget_is_spent(tmp_path, monkeypatch):
    monkeypatch.setattr(run, "PARTS", [_Sleeper("after", 60, 60)])
    assert (
        run.main(["--device", "cpu", "--parts", "after", "--budget", "5", "--out", str(tmp_path)])
        == 1
    )
    assert (
        json.loads((tmp_path / "gpu_check.json").read_text())["parts"]["after"]["status"]
        == "skipped"
    )


def test_colocated_figures_from_a_runs_metrics():
    rows = [
        {"step": 0, "eval/score": 0.5},
        {
            "step": 1,
            "timeperf/step": 2.0,
            "timeperf/weight_upload": 0.4,
            "timeperf/train_elapsed": 9,
            "colocate/release_servers_device_freed_mib": 900.0,
            "colocate/release_servers_device_used_before_mib": 1000.0,
            "consistency/kl_mean": 1e-4,
            "logprob_agreement/max_abs_diff": 0.05,
        },
        {
            "step": 2,
            "timeperf/step": 4.0,
            "timeperf/weight_upload": 0.6,
            "colocate/release_servers_device_freed_mib": 940.0,
            "colocate/release_servers_device_used_before_mib": 1000.0,
            "consistency/kl_mean": 3e-4,
            "logprob_agreement/max_abs_diff": 0.08,
            "eval/score": 0.7,
        },
    ]
    fig = summarize(rows, push_bytes=1000, copy_s=0.25)
    assert fig["steps"] == 2 and fig["seconds_per_step"] == {"step": 3.0, "weight_upload": 0.5}
    assert (fig["accuracy_start"], fig["accuracy_end"]) == (0.5, 0.7)
    assert fig["memory"]["release_share_of_used"] == 0.92
    assert fig["push"]["upload_over_copy"] == 2.0
    assert [g["kl_mean"] for g in fig["gate"]] == [1e-4, 3e-4]
    assert fig["sampled_logprob_gap_max"] == 0.08


def test_junit_counts(tmp_path):
    (tmp_path / "j.xml").write_text(
        '<testsuites><testsuite tests="5" failures="1" errors="0" skipped="3"/></testsuites>'
    )
    assert run.junit_counts(tmp_path / "j.xml") == {
        "tests": 5,
        "failed": 1,
        "errors": 0,
        "skipped": 3,
        "passed": 1,
    }


def test_wheels_are_pinned_to_the_versions_this_repository_runs():
    # the versions come from the lock (requirements/run.txt), which .venv installs
    for spec in prepare.pinned():
        name, pinned = spec.split("==")
        assert version(name) == pinned, (
            f"{name}: .venv has {version(name)}, the lock pins {pinned}"
        )
    assert run.cuda_test_files() == sorted(run.cuda_test_files())
    assert "tests/servers/test_server_cuda.py" in run.cuda_test_files()
