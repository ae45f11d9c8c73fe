"""GRPO runs driven from outside, for the end-to-end tests and the chaos benchmark: launcher
commands, the run's logs, and the processes under a launcher (to kill one of them on purpose)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import requests

ROOT = Path(__file__).parents[2]
EXPERIMENT = "toy-grpo"  # experiment_name of configs/toy_grpo*.yaml


def log_tail(path: str, n: int = 40) -> str:
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-n:])


def launcher_cmd(config: str, fileroot: Path, trial: str, overrides: list[str]) -> list[str]:
    return [sys.executable, "-m", "arealite.launcher.local", str(ROOT / config),
            f"cluster.fileroot={fileroot}", f"trial_name={trial}", *overrides]


def small_run(model: Path, data: Path, steps: int, epochs: int) -> list[str]:
    """Overrides for a fast run on the tiny model: 4 prompts x 2 samples per step, no eval."""
    return [f"actor.path={model}", f"train_dataset.path={data / 'train.jsonl'}",
            "train_dataset.batch_size=4", "valid_dataset=null", "gconfig.n_samples=2",
            "actor.group_size=2", "rollout.consumer_batch_size=4", "evaluator.freq_steps=null",
            f"total_train_steps={steps}", f"total_train_epochs={epochs}",
            "stats_logger.tensorboard=false"]


def run_dir(fileroot: Path, trial: str) -> Path:
    return fileroot / EXPERIMENT / trial


def metrics(fileroot: Path, trial: str) -> list[dict[str, Any]]:
    path = run_dir(fileroot, trial) / "logs" / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass  # a line being written
    return rows


def last_step(fileroot: Path, trial: str) -> int:
    return max((r["step"] for r in metrics(fileroot, trial)), default=-1)


def poll_until(cond: Callable[[], bool], proc, timeout: float, poll: float = 0.05) -> bool:
    """Poll ``cond`` until it holds (True); False once ``proc`` has ended or after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not cond():
        if proc.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(poll)
    return True


def wait_until(cond: Callable[[], bool], proc, log: str, timeout: float, what: str,
               poll: float = 0.05) -> None:
    """Poll ``cond`` until it holds; fail with the log's tail on timeout or when ``proc`` ends."""
    if poll_until(cond, proc, timeout, poll):
        return
    if proc.poll() is not None:
        raise AssertionError(f"exited ({proc.returncode}) before {what}:\n{log_tail(log, 60)}")
    raise AssertionError(f"timed out waiting for {what}:\n{log_tail(log, 60)}")


def wait_exit(proc, log: str, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    if proc.poll() is None:
        raise AssertionError(f"still running after {timeout:.0f}s:\n{log_tail(log, 60)}")
    return proc.returncode


def descendants(pid: int, match: Callable[[list[str]], bool]) -> list[psutil.Process]:
    """Live descendants of ``pid`` whose command line satisfies ``match``."""
    out = []
    for p in psutil.Process(pid).children(recursive=True):
        try:
            if match(p.cmdline()):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            pass
    return out


def is_trainer_worker(cmd: list[str]) -> bool:
    """The python process running the GRPO entry script (not torchrun, its parent)."""
    text = " ".join(cmd)
    return "arealite.trainer.grpo" in text and "torchrun" not in text and "distributed.run" not in text


def is_server(cmd: list[str]) -> bool:
    return "servers.launch_server" in " ".join(cmd)


def paused_server(launcher_pid: int, http_timeout: float = 1.0) -> psutil.Process | None:
    """A server under the launcher caught inside a weight update (``/server_info`` says paused),
    or None: one look at each."""
    for s in descendants(launcher_pid, is_server):
        try:
            cmd = s.cmdline()
            port = cmd[cmd.index("--port") + 1]
            st = requests.get(f"http://127.0.0.1:{port}/server_info", timeout=http_timeout).json()
        except (psutil.Error, ValueError, IndexError, requests.RequestException):
            continue
        if st.get("internal_states", [{}])[0].get("paused"):
            return s
    return None


def catch_paused_server(proc, timeout: float, http_timeout: float = 1.0) -> psutil.Process | None:
    """Poll (as fast as HTTP allows) until a server under the launcher ``proc`` is caught inside
    a weight update; None when the launcher ended or ``timeout`` s passed first."""
    hit: list[psutil.Process] = []

    def caught() -> bool:
        s = paused_server(proc.pid, http_timeout)
        if s is not None:
            hit.append(s)
        return s is not None

    return hit[-1] if poll_until(caught, proc, timeout, poll=0.0) else None


def signal_group(pid: int, sig: int) -> bool:
    """``sig`` to the process group ``pid`` leads (a launcher, a server: each starts its own),
    else to ``pid`` alone; False when it is gone."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def fresh_run_dir(fileroot: Path, experiment: str, trial: str) -> Path:
    """``{fileroot}/{experiment}/{trial}``, emptied: metrics.jsonl is appended to, so a rerun
    of the same trial must start clean."""
    out = fileroot / experiment / trial
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    return out
