"""The Slurm templates' wiring, run on this machine with stand-in ``srun``/``scontrol``.

There is no Slurm here: ``srun`` is replaced by a script that drops its options and runs the
command once (one node), ``scontrol show hostnames`` prints two loopback "nodes". What is tested
is the templates' own logic: servers started in server_only mode publish their addresses, the
trainer step waits for them, joins them into AREAL_LLM_SERVER_ADDRS and runs torchrun, and the
servers are stopped when the trainer finishes.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from arealite.utils.network import find_free_port
from tests.launcher.test_launcher_run import Run, _assert_no_orphans, _write_config

REPO = Path(__file__).resolve().parents[2]
SLURM = REPO / "deploy" / "slurm"
pytestmark = pytest.mark.integration


def _script(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def test_grpo_sbatch_wires_servers_to_trainer(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _script(bin_dir / "srun", "#!/bin/bash\n"
            "while [ $# -gt 0 ]; do case \"$1\" in --nodelist|--nodes) shift 2;; --*) shift;;"
            " *) break;; esac; done\nexec \"$@\"\n")
    _script(bin_dir / "scontrol", "#!/bin/bash\necho 127.0.0.1\necho 127.0.0.1\n")
    # The templates run `$PYTHON -m arealite.launcher.local`; route it through the test wrapper
    # that swaps in the stand-in server.
    _script(bin_dir / "py", "#!/bin/bash\n"
            "if [ \"$1\" = -m ] && [ \"$2\" = arealite.launcher.local ]; then\n"
            f"  shift 2; exec {sys.executable} -m tests.support.run_launcher \"$@\"\nfi\n"
            f"exec {sys.executable} \"$@\"\n")
    cfg = _write_config(tmp_path)
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": str(bin_dir / "py"),
        "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_ID": "42", "N_SERVER_NODES": "1",
        "GPUS_PER_NODE": "2", "GPUS_PER_SERVER": "1", "RDZV_PORT": str(find_free_port()),
        "SERVERS_ROOT": str(tmp_path / "servers"), "AREALITE_DEPLOY": str(SLURM),
        "ENTRY_MODULE": "tests.support.fake_trainer", "FAKE_TRAINER_MODE": "ok",
        "WAIT_SECS": "60", "POLL_SECS": "0.5",
    }
    overrides = ["launcher.server_host=127.0.0.1", "launcher.stop_grace=3"]
    run = Run(tmp_path, [], cmd=["bash", str(SLURM / "grpo.sbatch"), str(cfg), *overrides], **env)
    try:
        code = run.wait(timeout=120)
    finally:
        run.kill()
    out = run.text()
    assert code == 0, out
    ranks = [json.loads((tmp_path / f"rank{r}.ok").read_text()) for r in (0, 1)]
    assert len(ranks[0]["addrs"]) == 2 and ranks[0]["addrs"] == ranks[1]["addrs"]
    published = next((tmp_path / "servers").rglob("server_addrs")).read_text().strip()
    assert published == "AREAL_LLM_SERVER_ADDRS=" + ",".join(ranks[0]["addrs"])
    assert "servers: " + ",".join(ranks[0]["addrs"]) in out
    assert "[server1] fake server" in out  # 2 GPUs per node / 1 per server = 2 servers
    _assert_no_orphans(run, str(tmp_path))
