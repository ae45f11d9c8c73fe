"""The Ray launcher on a real multi-node Ray cluster (no mock): ``ray.cluster_utils.Cluster``
starts a head and a worker node as separate raylets on this host, each with its own custom
resource, so placement by resources is real placement on different nodes.

The toy GRPO job trains with both servers on the worker node and the trainer on the head node;
a server process killed mid-run is restarted by Ray on its port and re-admitted by the client at
the current weights, and killed once more (no restart left) it stops the run, named; a killed
trainer actor stops everything and ``recover.mode=auto`` resumes on the next launch. Every
process the launcher and the cluster started is gone afterwards.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from arealite.demo.toy_math import write_toy_math
from benchmarks.harness.grpo_runs import last_step, metrics, small_run, wait_exit, wait_until
from tests.support.procs import log_tail, spawn

ray = pytest.importorskip("ray")  # installed by `make test` (arealite[ray])
pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TRIAL_TIMEOUT = 240


def _ray_procs() -> dict[int, psutil.Process]:
    """Ray's daemons and workers under this test process (the cluster it started)."""
    out = {}
    for p in psutil.Process().children(recursive=True):
        try:
            out[p.pid] = p
        except psutil.Error:
            pass
    return out


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    mp = pytest.MonkeyPatch()
    mp.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    # children from before the cluster (other tests' session-scoped servers) are not Ray's
    before = set(_ray_procs())
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": {"trainer_node": 1}, "node_ip_address": "127.0.0.1",
        "include_dashboard": False})
    worker = c.add_node(num_cpus=2, resources={"server_node": 2}, node_ip_address="127.0.0.1")
    c.wait_for_nodes()
    seen = {pid: p for pid, p in _ray_procs().items() if pid not in before}
    try:
        yield c, c.head_node.node_id, worker.node_id, seen
    finally:
        seen.update({pid: p for pid, p in _ray_procs().items() if pid not in before})
        c.shutdown()
        left = [p for p in seen.values() if _running(p)]
        deadline = time.monotonic() + 15
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = [p for p in left if _running(p)]
        for p in left:  # fail, but leave nothing behind
            p.kill()
        mp.undo()
        assert not left, f"Ray processes left: {[p.cmdline()[:2] for p in left]}"


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _ours(token: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if token in " ".join(p.info["cmdline"] or []) and p.pid != os.getpid() and _running(p):
                out.append(p)
        except psutil.Error:
            pass
    return out


def _cmd(cluster, fileroot: Path, trial: str, over: list[str]) -> list[str]:
    return [sys.executable, "-m", "arealite.launcher.ray", str(REPO / "configs/toy_grpo.yaml"),
            "--address", cluster.address, f"cluster.fileroot={fileroot}", f"trial_name={trial}",
            *over]


def _assert_no_orphans(token: str, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while _ours(token) and time.monotonic() < deadline:
        time.sleep(0.3)
    left = _ours(token)
    for p in left:
        p.kill()
    assert not left, [p.cmdline()[:6] for p in left]


def _overrides(tiny_model_dir: Path, data: Path, steps: int) -> list[str]:
    return [*small_run(tiny_model_dir, data, steps, epochs=1), "launcher.n_servers=2",
            "rollout.max_concurrent_rollouts=8", "weight_update.type=disk",
            "launcher.ray.server_resources={server_node: 1}",
            "launcher.ray.trainer_resources={trainer_node: 1}", "launcher.stop_grace=5",
            "rollout.health_check_interval=1"]


def _listening(token: str) -> dict[str, int]:
    """``ip:port`` -> pid of every embedded server of this test listening there."""
    out = {}
    for p in _ours(token):
        if "servers.launch_server" in " ".join(p.cmdline()):
            for conn in p.net_connections("tcp"):
                if conn.status == psutil.CONN_LISTEN:
                    out[f"{conn.laddr.ip}:{conn.laddr.port}"] = p.pid
    return out


def test_servers_and_trainer_on_different_nodes_and_a_dead_server(
        cluster, tmp_path, tiny_model_dir):
    """Placement and addresses; a killed server restarted by Ray and re-admitted; killed again
    with no restart left (and launcher.max_server_failures=0), the run stops naming it."""
    c, head_id, worker_id, _ = cluster
    data = tmp_path / "data"
    write_toy_math(data, n_train=400, n_valid=4, seed=0)
    # never reached: the second kill stops the run, however long the restart takes under load
    steps = 1000
    over = [*_overrides(tiny_model_dir, data, steps), "launcher.ray.server_restarts=1",
            "total_train_epochs=100"]
    trial = "placed"
    with spawn(_cmd(c, tmp_path, trial, over)) as (proc, log):
        t0 = time.monotonic()
        wait_until(lambda: last_step(tmp_path, trial) >= 2, proc, log, TRIAL_TIMEOUT, "step 2")
        print(f"ray: launch to step 2 in {time.monotonic() - t0:.1f}s")
        out = log_tail(log, 400)
        placed = dict(re.findall(r"(server\d|trainer) on node (\w+)", out))
        assert placed == {"server0": worker_id[:12], "server1": worker_id[:12],
                          "trainer": head_id[:12]}, out
        # The addresses the trainer got are the ones the server processes listen on.
        given = re.search(r"AREAL_LLM_SERVER_ADDRS=(\S+)", out.split("trainer on node")[1])
        addrs = given.group(1).split(",")
        listening = _listening(str(tmp_path))
        assert sorted(listening) == sorted(addrs), (listening, addrs)
        # Kill server1's process: Ray restarts its actor, which serves the same address again,
        # and the client re-syncs it to the current weights and re-admits it.
        victim = addrs[1]
        os.killpg(os.getpgid(listening[victim]), signal.SIGKILL)
        killed_after, t_kill = last_step(tmp_path, trial), time.monotonic()
        wait_until(lambda: f"server {victim} re-admitted" in log_tail(log, 400), proc, log,
                   TRIAL_TIMEOUT, "the restarted server's re-admission", poll=0.2)
        print(f"ray: server killed to re-admitted in {time.monotonic() - t_kill:.1f}s")
        back_at = last_step(tmp_path, trial)
        wait_until(lambda: last_step(tmp_path, trial) >= back_at + 2, proc, log, TRIAL_TIMEOUT,
                   "two steps after the re-admission")
        # Kill it again: no restart left, and no failure allowed: the run stops, naming it.
        os.killpg(os.getpgid(_listening(str(tmp_path))[victim]), signal.SIGKILL)
        code = wait_exit(proc, log, 120)
        out = log_tail(log, 3000)
    assert killed_after < back_at, (killed_after, back_at)
    assert "server1 died; Ray restarts its actor (restart 1/1)" in out, out[-6000:]
    assert f"server1 restarted by Ray at {victim};" in out, out[-6000:]
    assert f"server {victim} re-synced to version" in out, out[-6000:]
    assert code != 0 and "server1 died (no restarts left); its last" in out, out[-6000:]
    assert "restart 2/1" not in out
    rows = [r["step"] for r in metrics(tmp_path, trial) if r["step"] >= 1]
    assert rows == list(range(1, len(rows) + 1)) and rows[-1] >= back_at + 2, rows
    _assert_no_orphans(str(tmp_path))


@pytest.mark.long
def test_killed_trainer_actor_stops_everything_and_auto_recovery_resumes(
        cluster, tmp_path, tiny_model_dir):
    c = cluster[0]
    data = tmp_path / "data"
    write_toy_math(data, n_train=200, n_valid=4, seed=0)
    steps = 6
    over = [*_overrides(tiny_model_dir, data, steps), "recover.mode=auto", "recover.freq_steps=1"]
    with spawn(_cmd(c, tmp_path, "rec", over)) as (proc, log):
        wait_until(lambda: last_step(tmp_path, "rec") >= 2, proc, log, TRIAL_TIMEOUT, "step 2")
        torchrun = [p for p in _ours(str(tmp_path)) if "--master-port" in p.cmdline()]
        assert len(torchrun) == 1, [p.cmdline()[:4] for p in torchrun]
        actor = torchrun[0].parent()  # the Ray worker process hosting the trainer actor
        assert "servers.launch_server" not in " ".join(actor.cmdline())
        actor.kill()
        killed_after = last_step(tmp_path, "rec")
        code = wait_exit(proc, log, 120)
        out = log_tail(log, 400)
    assert code != 0 and "trainer actor died; recover.mode=auto resumes" in out, out[-4000:]
    _assert_no_orphans(str(tmp_path))
    assert killed_after < steps - 1, "the trainer died too late to test a resume"
    with spawn(_cmd(c, tmp_path, "rec", over)) as (proc, log):
        code = wait_exit(proc, log, TRIAL_TIMEOUT)
        out = log_tail(log, 2000)
    assert code == 0, out[-6000:]
    logged = [r["step"] for r in metrics(tmp_path, "rec") if r["step"] >= 1]
    # Resumed from a checkpoint: the run went on past where it was killed up to the last step,
    # without starting again at step 1.
    assert logged.count(1) == 1 and logged[-1] == steps, logged
    _assert_no_orphans(str(tmp_path))
