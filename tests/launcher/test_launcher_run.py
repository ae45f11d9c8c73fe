"""The local launcher as a user runs it: a separate process starting servers and torchrun.

Most tests use stand-in servers/trainers (tests/launcher/fake_*.py) to drive each path of the
supervision logic; the real embedded server is used for the bad-model-path failure and, when
``servers.launch_server`` exists, for an end-to-end start.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.support.min_assets import min_model

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


def _write_config(tmp_path: Path, **launcher) -> Path:
    min_model(tmp_path / "model")  # what the pre-launch check reads; the servers here are fakes
    cfg = {
        "kind": "grpo", "experiment_name": "lt", "trial_name": "t",
        "cluster": {"fileroot": str(tmp_path)},
        "actor": {"path": str(tmp_path / "model")},
        "launcher": {"n_servers": 1, "trainer_nproc": 1, "stop_grace": 3, "startup_timeout": 30,
                     "entry_module": "tests.support.fake_trainer", **launcher},
    }
    p = tmp_path / "cfg.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


class Run:
    """The launcher started as ``python -m tests.support.run_launcher``, in its own group."""

    def __init__(self, tmp_path: Path, args: list[str], fake_server: bool = True,
                 cmd: list[str] | None = None, **env: str):
        self.out, self.err = tmp_path / "launcher.out", tmp_path / "launcher.err"
        full_env = {**os.environ, "OMP_NUM_THREADS": "1", **env}
        if fake_server:
            full_env["FAKE_SERVER_MODULE"] = "tests.support.fake_server"
        self.t0 = time.monotonic()
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen(
                cmd or [sys.executable, "-m", "tests.support.run_launcher", *args], cwd=REPO,
                env=full_env, stdout=out, stderr=err, start_new_session=True)
        self.seen: dict[int, psutil.Process] = {}

    def watch(self) -> None:
        try:
            for p in psutil.Process(self.proc.pid).children(recursive=True):
                self.seen.setdefault(p.pid, p)
        except psutil.Error:
            pass

    def wait(self, timeout: float = 180) -> int:  # 54 s seen under load for 26 s quiet
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.watch()
            time.sleep(0.1)
        if self.proc.poll() is None:
            self.kill()
            raise AssertionError(f"launcher still running after {timeout}s\n{self.text()}")
        self.elapsed = time.monotonic() - self.t0
        return self.proc.returncode

    def wait_for(self, pred, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.watch()
            if pred():
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"launcher exited early\n{self.text()}")
            time.sleep(0.1)
        raise AssertionError(f"condition not met in {timeout}s\n{self.text()}")

    def text(self) -> str:
        return self.out.read_text() + "\n--- stderr ---\n" + self.err.read_text()

    def kill(self) -> None:
        """Clean-up after a failed assertion: SIGKILL the launcher's group and its children's."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        for p in self.seen.values():
            try:
                if p.is_running():
                    os.killpg(os.getpgid(p.pid), signal.SIGKILL)
            except (psutil.Error, OSError):
                pass


def _leftovers(token: str) -> list[str]:
    out = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE or p.pid == os.getpid():
                continue
            if token in " ".join(p.info["cmdline"] or []):
                out.append(f"{p.pid}: {' '.join(p.info['cmdline'])}")
        except psutil.Error:
            pass
    return out


def _assert_no_orphans(run: Run, token: str, within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = [p for p in run.seen.values() if p.is_running() and
                 p.status() != psutil.STATUS_ZOMBIE]
        if not alive and not _leftovers(token):
            return
        time.sleep(0.2)
    run.kill()
    raise AssertionError(f"orphans: {_leftovers(token)} {[p.pid for p in alive]}")


def test_servers_and_two_trainer_ranks_run_to_completion(tmp_path):
    cfg = _write_config(tmp_path, n_servers=2, trainer_nproc=2, server_threads=2)
    run = Run(tmp_path, [str(cfg)], FAKE_TRAINER_MODE="ok")
    try:
        assert run.wait() == 0, run.text()
    finally:
        run.kill()
    out = run.text()
    ranks = [json.loads((tmp_path / f"rank{r}.ok").read_text()) for r in (0, 1)]
    assert ranks[0]["addrs"] == ranks[1]["addrs"] and len(ranks[0]["addrs"]) == 2
    assert ranks[0]["omp"] == "1"
    assert "[server0] fake server" in out and "[server1] fake server" in out and "omp=2" in out
    assert "[trainer] trainer rank 0/2" in out and "[trainer] trainer rank 1/2" in out
    logs = tmp_path / "lt" / "t" / "logs"
    assert {"server0.log", "server1.log", "trainer.log", "launcher.log"} <= {
        p.name for p in logs.iterdir()}
    assert "trainer rank 1/2" in (logs / "trainer.log").read_text()
    addrs_file = (tmp_path / "lt" / "t" / "server_addrs").read_text().strip()
    assert addrs_file == "AREAL_LLM_SERVER_ADDRS=" + ",".join(ranks[0]["addrs"])
    _assert_no_orphans(run, str(tmp_path))


def test_server_that_cannot_start_ends_the_run_with_its_last_lines(tmp_path):
    cfg = _write_config(tmp_path, n_servers=2)
    run = Run(tmp_path, [str(cfg)], FAKE_SERVER_MODE="crash")
    try:
        code = run.wait()
    finally:
        run.kill()
    assert code == 3, run.text()
    err = run.err.read_text()
    assert "exited with code 3 before becoming healthy" in err
    assert "fatal: cannot load model from" in err  # the failing part's last lines
    assert run.elapsed < 30
    _assert_no_orphans(run, str(tmp_path))


def test_startup_timeout(tmp_path):
    cfg = _write_config(tmp_path, startup_timeout=2)
    run = Run(tmp_path, [str(cfg)], FAKE_SERVER_MODE="hang")
    try:
        code = run.wait()
    finally:
        run.kill()
    assert code == 1
    assert "did not become healthy within 2s" in run.err.read_text()
    _assert_no_orphans(run, str(tmp_path))


def test_failing_trainer_stops_everything(tmp_path):
    cfg = _write_config(tmp_path, n_servers=2, trainer_nproc=2)
    run = Run(tmp_path, [str(cfg)], FAKE_TRAINER_MODE="fail")
    try:
        code = run.wait()
    finally:
        run.kill()
    assert code != 0
    err = run.err.read_text()
    assert "trainer exited with code" in err and "boom: trainer rank" in err
    _assert_no_orphans(run, str(tmp_path))


def test_server_dying_mid_run_stops_the_run(tmp_path):
    cfg = _write_config(tmp_path)
    run = Run(tmp_path, [str(cfg)], FAKE_SERVER_MODE="die:3", FAKE_TRAINER_MODE="hang")
    try:
        code = run.wait()
    finally:
        run.kill()
    assert code == 9 and "server0 exited with code 9" in run.err.read_text()
    _assert_no_orphans(run, str(tmp_path))


def test_run_survives_allowed_server_failures(tmp_path):
    cfg = _write_config(tmp_path, n_servers=2, max_server_failures=1)
    run = Run(tmp_path, [str(cfg)], FAKE_SERVER_MODE="die:3", FAKE_SERVER_ONLY_SEED="2",
              FAKE_TRAINER_MODE="wait:6")
    try:
        code = run.wait()
    finally:
        run.kill()
    assert code == 0, run.text()
    assert "server1 exited with code 9; continuing on the other servers" in run.err.read_text()
    _assert_no_orphans(run, str(tmp_path))


def test_sigterm_stops_everything_including_torchrun_workers_children(tmp_path):
    cfg = _write_config(tmp_path, n_servers=2, trainer_nproc=2)
    run = Run(tmp_path, [str(cfg)], FAKE_SERVER_MODE="stubborn", FAKE_TRAINER_MODE="hang")
    try:
        run.wait_for(lambda: all((tmp_path / f"grandchild{r}.pid").exists() for r in (0, 1)))
        time.sleep(1.5)  # let the launcher see the grandchildren at least once
        run.watch()
        os.kill(run.proc.pid, signal.SIGTERM)
        code = run.wait(timeout=30)
    finally:
        run.kill()
    assert code == 128 + signal.SIGTERM, run.text()
    assert "SIGTERM received" in run.err.read_text()
    _assert_no_orphans(run, str(tmp_path))


def test_auto_recovery_restarts_only_the_trainer(tmp_path):
    cfg = _write_config(tmp_path)
    run = Run(tmp_path, [str(cfg), "recover.mode=auto", "recover.retries=2"],
              FAKE_TRAINER_MODE="recover")
    try:
        code = run.wait()
    finally:
        run.kill()
    assert code == 0, run.text()
    assert len((tmp_path / "trainer_runs.txt").read_text().splitlines()) == 2
    assert "restarting the trainer from" in run.err.read_text()
    assert "resumed from a recovery checkpoint" in run.out.read_text()
    server_log = (tmp_path / "lt" / "t" / "logs" / "server0.log").read_text()
    assert server_log.count("fake server pid=") == 1  # the server was kept
    _assert_no_orphans(run, str(tmp_path))


def test_a_restarted_trainer_gets_only_the_live_servers(tmp_path):
    """server1 dies, then the trainer crashes: the restarted trainer must not be handed the
    dead server (it waits for every server it is given, so each restart would fail)."""
    cfg = _write_config(tmp_path, n_servers=2, max_server_failures=1)
    run = Run(tmp_path, [str(cfg), "recover.mode=auto", "recover.retries=2"],
              FAKE_SERVER_MODE="die:3", FAKE_SERVER_ONLY_SEED="2",
              FAKE_TRAINER_MODE="recover-after:6")
    try:
        code = run.wait()
    finally:
        run.kill()
    assert code == 0, run.text()
    runs = [line.split() for line in (tmp_path / "trainer_runs.txt").read_text().splitlines()]
    assert len(runs) == 2
    first, second = runs[0][1].split(","), runs[1][1].split(",")
    assert len(first) == 2 and len(second) == 1 and second[0] == first[0]
    assert "servers kept: 1 live" in run.err.read_text()
    _assert_no_orphans(run, str(tmp_path))


def test_recovery_without_checkpoint_or_retries_fails(tmp_path):
    cfg = _write_config(tmp_path)
    run = Run(tmp_path, [str(cfg), "recover.mode=auto", "recover.retries=0"],
              FAKE_TRAINER_MODE="recover")
    try:
        code = run.wait()
    finally:
        run.kill()
    err = run.err.read_text()
    assert code != 0 and "trainer exited with code" in err and "restarting" not in err
    _assert_no_orphans(run, str(tmp_path))


def test_server_only_then_trainer_only(tmp_path):
    cfg = _write_config(tmp_path, n_servers=2)
    servers = Run(tmp_path, [str(cfg), "launcher.mode=server_only"])
    try:
        servers.wait_for(lambda: "AREAL_LLM_SERVER_ADDRS=" in servers.out.read_text())
        line = next(x for x in servers.out.read_text().splitlines()
                    if x.startswith("AREAL_LLM_SERVER_ADDRS="))
        addrs = line.split("=", 1)[1]
        (tmp_path / "t2").mkdir()
        cfg2 = _write_config(tmp_path / "t2")
        trainer = Run(tmp_path / "t2", [str(cfg2), "launcher.mode=trainer_only"],
                      FAKE_TRAINER_MODE="ok", AREAL_LLM_SERVER_ADDRS=addrs)
        try:
            assert trainer.wait() == 0, trainer.text()
        finally:
            trainer.kill()
        assert json.loads((tmp_path / "t2" / "rank0.ok").read_text())["addrs"] == addrs.split(",")
        assert "[server" not in trainer.out.read_text()  # it started no servers
        os.kill(servers.proc.pid, signal.SIGINT)
        assert servers.wait(timeout=30) == 128 + signal.SIGINT
    finally:
        servers.kill()
    _assert_no_orphans(servers, str(tmp_path))


def test_bad_model_path_with_the_embedded_server(tmp_path):
    """The issue's failure-path test, with the real ``servers.launch_server``: a missing model
    folder is one line before anything starts (#37); a folder the server cannot load ends the
    run with one line naming the server's own error and its log, the traceback in the log."""
    cfg = _write_config(tmp_path, n_servers=2, startup_timeout=120)
    run = Run(tmp_path, [str(cfg), f"actor.path={tmp_path / 'no_such_model'}"], fake_server=False)
    try:
        assert run.wait(timeout=150) == 2, run.text()
    finally:
        run.kill()
    assert "no such folder" in run.err.read_text() and "[server" not in run.out.read_text()
    bad = tmp_path / "not_a_model"
    bad.mkdir()
    (bad / "config.json").write_text("{}")  # a model folder in name only
    run = Run(tmp_path, [str(cfg), f"actor.path={bad}"], fake_server=False)
    try:
        code = run.wait(timeout=150)
    finally:
        run.kill()
    err = run.err.read_text()
    assert code != 0 and "before becoming healthy" in err, run.text()
    assert run.elapsed < 60, f"took {run.elapsed:.0f}s"
    fail = [ln for ln in err.splitlines() if "before becoming healthy" in ln]
    # the server's own reason, and where the rest is
    assert len(fail) == 1 and str(bad) in fail[0] and "log: " in fail[0], err
    assert "Traceback" not in run.out.read_text() + err  # the traceback stays in the log
    _assert_no_orphans(run, str(tmp_path))


@pytest.mark.skipif(importlib.util.find_spec("servers.launch_server") is None,
                    reason="servers/launch_server.py not there yet")
def test_one_embedded_server_and_a_trivial_trainer(tmp_path, tiny_model_dir):
    cfg = _write_config(tmp_path, startup_timeout=120)
    run = Run(tmp_path, [str(cfg), f"actor.path={tiny_model_dir}", "servers.dtype=float32"],
              fake_server=False, FAKE_TRAINER_MODE="ok")
    try:
        assert run.wait(timeout=150) == 0, run.text()
    finally:
        run.kill()
    assert json.loads((tmp_path / "rank0.ok").read_text())["addrs"]
    _assert_no_orphans(run, str(tmp_path))
