"""The Slurm templates submitted to a real Slurm: ``make test-slurm`` starts a one-node Slurm
from the distribution's packages (``deploy/slurm/local_cluster.sh``, as root) and runs this file
with ``AREALITE_TEST_SLURM=1``; elsewhere it is skipped (``make test`` does not start Slurm).

``sbatch deploy/slurm/grpo.sbatch`` runs the toy GRPO job as two job steps on the one node:
servers (``launcher.mode=server_only``) in one, the torchrun trainer in the other. The servers'
addresses and the API keys the servers step generated reach the trainer step through
``$SERVERS_ROOT``; the job trains every step and leaves no process behind.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from arealite.demo.toy_math import write_toy_math
from arealite.utils.network import find_free_port
from benchmarks.harness.grpo_runs import last_step, metrics, small_run

REPO = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.environ.get("AREALITE_TEST_SLURM") != "1" or not shutil.which("sbatch"),
                       reason="needs a running Slurm: make test-slurm"),
]
STEPS = 6
JOB_TIMEOUT = 420


def _ours(token: str) -> list[str]:
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            if token in cmd and p.pid != os.getpid() and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(f"{p.pid}: {cmd[:200]}")
        except psutil.Error:
            pass
    return out


def test_grpo_sbatch_trains_with_servers_and_trainer_in_two_job_steps(tmp_path, tiny_model_dir):
    data = tmp_path / "data"
    write_toy_math(data, n_train=200, n_valid=4, seed=0)
    servers_root = tmp_path / "servers"
    fileroot = tmp_path / "outputs"  # the config's relative `outputs`, from --chdir
    env = {**os.environ, "SERVERS_ROOT": str(servers_root), "N_SERVER_NODES": "1",
           "AREALITE_DEPLOY": str(REPO / "deploy" / "slurm"), "PYTHON": sys.executable,
           "GPUS_PER_NODE": "1", "GPUS_PER_SERVER": "1", "RDZV_PORT": str(find_free_port()),
           "WAIT_SECS": "300", "POLL_SECS": "1", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    for k in ("AREALITE_API_KEY", "AREALITE_ADMIN_API_KEY"):
        env.pop(k, None)  # the template generates the run's keys
    over = [*small_run(tiny_model_dir, data, STEPS, epochs=1), "trial_name=slurm",
            "launcher.server_backend=embedded", "launcher.gpus_per_server=0",
            "launcher.server_host=127.0.0.1", "launcher.stop_grace=5"]
    out_file = tmp_path / "job.out"
    name = f"arealite-test-{os.getpid()}"
    cmd = ["sbatch", "--wait", f"--job-name={name}", "--nodes=1", "--cpus-per-task=2", "--gpus-per-node=0",
           "--time=00:15:00", f"--output={out_file}", f"--chdir={tmp_path}",
           str(REPO / "deploy" / "slurm" / "grpo.sbatch"), str(REPO / "configs/toy_grpo.yaml"),
           *over]
    t0 = time.monotonic()
    job = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, start_new_session=True)
    first_step = None
    try:
        deadline = time.monotonic() + JOB_TIMEOUT
        while job.poll() is None and time.monotonic() < deadline:
            if first_step is None and last_step(fileroot, "slurm") >= 1:
                first_step = time.monotonic() - t0
            time.sleep(0.5)
        if job.poll() is None:
            raise AssertionError(f"job still running after {JOB_TIMEOUT}s:\n"
                                 f"{out_file.read_text() if out_file.exists() else ''}")
        submitted = job.stdout.read()
    finally:
        if job.poll() is None:
            subprocess.run(["scancel", f"--name={name}"], check=False)
            os.killpg(job.pid, 9)
    text = out_file.read_text()
    assert job.returncode == 0, f"{submitted}\n{text[-6000:]}"
    print(f"slurm: submit to first step {first_step:.1f}s, whole job {time.monotonic() - t0:.1f}s")

    rows = [r["step"] for r in metrics(fileroot, "slurm") if r["step"] >= 1]
    assert rows == list(range(1, STEPS + 1)), rows
    # The trainer step got the addresses the servers step published.
    published = next(servers_root.rglob("server_addrs")).read_text().strip()
    addrs = published.removeprefix("AREAL_LLM_SERVER_ADDRS=")
    assert f"servers: {addrs}" in text, text[-4000:]
    assert "[server0] " in text
    # Keys: generated once by the servers step, readable by the job's user only, shared with
    # the trainer step, never printed.
    keys_file = servers_root / "api_keys"
    assert stat.S_IMODE(keys_file.stat().st_mode) == 0o600
    keys = dict(re.findall(r"export (\w+)=(\S+)", keys_file.read_text()))
    assert set(keys) == {"AREALITE_API_KEY", "AREALITE_ADMIN_API_KEY"}
    assert f"api keys: from {keys_file}" in text
    assert not any(v in text for v in keys.values())
    deadline = time.monotonic() + 20
    while _ours(str(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _ours(str(tmp_path)), _ours(str(tmp_path))
