"""tests/support/schedule.py under pytest-xdist as ``make test`` runs it (``-n 2 --dist loadfile``):
each worker's first file is a long one, though the short files hold more tests (xdist's default
re-sort, most tests a file first, would hand those out first)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_long_files_go_first_to_the_xdist_workers(tmp_path: Path):
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    long: a long file\n")
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["tests.support.schedule"]\n')
    for name in ("a", "b", "c"):  # short files, many tests each, collected before the long ones
        (tmp_path / f"test_{name}_short.py").write_text(
            "".join(f"def test_{i}():\n    pass\n" for i in range(6))
        )
    for name in ("x", "y"):
        (tmp_path / f"test_{name}_long.py").write_text(
            "import pytest\n\n@pytest.mark.long\ndef test_one():\n    pass\n\n"
            "def test_two():\n    pass\n"
        )
    # no entry-point plugins but xdist: the workers start in seconds
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "xdist",
            "-p",
            "no:cacheprovider",
            "-v",
            "-n",
            "2",
            "--dist",
            "loadfile",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    ran: dict[str, list[str]] = defaultdict(list)  # worker -> its files, in the order it ran them
    for worker, path in re.findall(r"\[(gw\d)\].*PASSED (\S+)::", res.stdout):
        if not ran[worker] or ran[worker][-1] != path:
            ran[worker].append(path)
    assert sorted(ran) == ["gw0", "gw1"], res.stdout
    assert sorted(files[0] for files in ran.values()) == ["test_x_long.py", "test_y_long.py"], ran
    assert sum(len(files) for files in ran.values()) == 5, ran  # each file on one worker
