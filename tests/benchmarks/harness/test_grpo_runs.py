"""The run helpers the GRPO tests and the chaos and exactly-once studies share: polling a
condition against a process, and signalling a process group."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from benchmarks.harness.grpo_runs import poll_until, signal_group


def _sleeper(**kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], **kw)


def test_poll_until_holds_times_out_or_sees_the_process_end():
    proc = _sleeper(start_new_session=True)
    try:
        calls = []
        assert poll_until(lambda: calls.append(1) or len(calls) >= 3, proc, 10, poll=0.001)
        assert len(calls) == 3
        t0 = time.monotonic()
        assert not poll_until(lambda: False, proc, 0.2, poll=0.01)
        assert time.monotonic() - t0 >= 0.2
    finally:
        proc.kill()
        proc.wait(10)
    t0 = time.monotonic()
    assert not poll_until(lambda: False, proc, 30, poll=0.01)  # ended: no wait for the timeout
    assert time.monotonic() - t0 < 5


def test_signal_group_reaches_the_group_and_says_when_it_is_gone():
    leader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "print('up', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert leader.stdout.readline().strip() == "up"
        import psutil

        child = psutil.Process(leader.pid).children()[0]
        assert signal_group(leader.pid, signal.SIGKILL)
        leader.wait(10)
        child.wait(10)  # the group's other member got it too
    finally:
        if leader.poll() is None:
            leader.kill()
    assert not signal_group(leader.pid, signal.SIGKILL)
    lone = _sleeper()  # in the test's own group: only it is signalled
    assert signal_group(lone.pid, signal.SIGTERM)
    assert lone.wait(10) == -signal.SIGTERM
