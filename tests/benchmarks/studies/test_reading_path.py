"""The reading-path study's counting: which traced modules count, and the figures."""

from __future__ import annotations

import pytest

from benchmarks.studies.reading_path import counted, measure, report, role

TRAINER = ["python", "-m", "arealite.trainer.grpo", "cfg.yaml"]
TORCHRUN = [
    "python",
    "-m",
    "torch.distributed.run",
    "--nproc-per-node",
    "1",
    "-m",
    "arealite.trainer.grpo",
    "cfg.yaml",
]
LENGTHS = {
    "arealite/trainer/grpo.py": 56,
    "arealite/weights/push.py": 146,
    "arealite/rollout/remote_engine.py": 480,
    "arealite/api/io_struct.py": 345,
    "arealite/utils/http.py": 239,
    "arealite/rollout/__init__.py": 26,
    "workflows/rlvr.py": 189,
    "servers/routes/control.py": 349,
    "arealite/launcher/local.py": 399,
}


def test_roles_by_command_line():
    assert role(TRAINER) == "trainer"
    assert role(TORCHRUN) == "other"  # torchrun's own process runs none of the step
    assert role(["python", "-m", "servers.launch_server", "--model-path", "m"]) == "server"
    assert role(["python", "-m", "arealite.launcher.local", "cfg.yaml"]) == "launcher"


@pytest.mark.parametrize(
    "path,expected",
    [
        ("arealite/trainer/grpo.py", True),
        ("arealite/engine/ppo/loss.py", True),
        ("arealite/api/io_struct.py", False),
        ("arealite/utils/http.py", False),
        ("arealite/observe/timing.py", False),
        ("arealite/rollout/__init__.py", False),
        ("workflows/rlvr.py", False),
        ("servers/routes/control.py", False),
    ],
)
def test_counted(path, expected):
    assert counted(path) is expected


def test_measure_counts_what_ran_in_the_trainer():
    dumps = [
        {
            "argv": TRAINER,
            "run": {
                "arealite/trainer/grpo.py": [30, 31],
                "arealite/weights/push.py": [80, 81, 82],
                "arealite/rollout/remote_engine.py": [395],
                "arealite/api/io_struct.py": [10],
                "arealite/utils/http.py": [],
                "arealite/rollout/__init__.py": [3],
                "workflows/rlvr.py": [50],
            },
            "after_mark": {"arealite/weights/push.py": [81, 82], "arealite/api/io_struct.py": [10]},
            "window": {
                "arealite/weights/push.py": [80, 81],
                "arealite/rollout/remote_engine.py": [395],
                "arealite/api/io_struct.py": [10],
            },
        },
        # a second rank: the union counts, each line once
        {"argv": TRAINER, "run": {"arealite/weights/push.py": [82, 83]}, "window": {}},
        {"argv": TORCHRUN, "run": {}, "window": {}},
        {
            "argv": ["python", "-m", "servers.launch_server"],
            "run": {"servers/routes/control.py": [1, 2]},
            "window": {"servers/routes/control.py": [2]},
        },
        {
            "argv": ["python", "-m", "arealite.launcher.local"],
            "run": {"arealite/launcher/local.py": [5]},
            "window": {},
        },
    ]
    fig = measure(dumps, LENGTHS.__getitem__)
    p = fig["path"]
    assert (p["modules"], p["lines"], p["ran"]) == (3, 480 + 146 + 56, 1 + 4 + 2)
    assert [m["path"] for m in p["list"]] == [
        "arealite/rollout/remote_engine.py",
        "arealite/weights/push.py",
        "arealite/trainer/grpo.py",
    ]
    assert p["folders"] == ["arealite/rollout", "arealite/trainer", "arealite/weights"]
    s = fig["step"]  # what ran from the first step on: push.py alone (io_struct not counted)
    assert (s["modules"], s["lines"], s["ran"]) == (1, 146, 2)
    assert fig["path_excluded"]["modules"] == 1  # io_struct; http's empty list ran nothing
    assert fig["workflows"]["modules"] == 1
    w = fig["push"]
    assert (w["modules"], w["lines"], len(w["folders"])) == (2, 626, 2)
    assert fig["server_push"]["modules"] == 1 and fig["launcher"]["modules"] == 1
    text = report(fig, "distributed")
    assert "reading path modules: 3 (target <= 12)" in text
    assert "weight push folders: 2 (target <= 2)" in text
    assert "reading path from the first step on: 1 modules, 146 lines" in text


def test_measure_refuses_a_run_without_a_trainer_trace():
    with pytest.raises(ValueError, match="no trace from a trainer"):
        measure([{"argv": TORCHRUN, "run": {}, "window": {}}], LENGTHS.__getitem__)
