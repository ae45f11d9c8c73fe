"""The sandbox contains hostile programs: each returns quickly with the test failed, and
nothing of it survives or leaks onto the machine."""

import os
import socket
import time
import uuid

import pytest

from tests.support.wf_procs import sandbox_processes as _sandbox_processes
from workflows.sandbox import SandboxLimits, normalize_tests, run_tests, sandbox_layers

# Every test here but the last runs the sandbox (several processes): integration.
LIM = SandboxLimits(timeout_per_test=1.0)
PRINT_DONE = [{"input": "", "output": "done"}]


def _run(code, tests=PRINT_DONE, limits=LIM, max_seconds=8.0):
    t0 = time.monotonic()
    res = run_tests(code, tests, limits)
    took = time.monotonic() - t0
    assert took < max_seconds, f"sandbox took {took:.1f}s"
    assert not _sandbox_processes(), "a sandboxed process outlived its run"
    return res


@pytest.mark.integration
def test_correct_and_wrong_programs():
    tests = [{"input": "2 3", "output": "5"}, {"input": "10 -4", "output": "6\n"}]
    ok = _run("a, b = map(int, input().split())\nprint(a + b)", tests)
    assert ok.passed == 2 and ok.fraction == 1.0 and ok.error is None
    wrong = _run("a, b = map(int, input().split())\nprint(a * b)", tests)
    assert wrong.passed == 0 and wrong.outcomes[0].reason == "wrong answer"


@pytest.mark.integration
def test_call_and_assert_tests():
    code = "def double(x):\n    return [x, x]\nclass Solution:\n    def twice(self, x):\n        return 2 * x\n"
    res = _run(code, [{"fn_name": "double", "args": [3], "expected": [3, 3]},
                      {"fn_name": "twice", "args": [2.5], "expected": 5.0},
                      {"fn_name": "twice", "args": [2], "expected": 5},
                      "assert double(1) == [1, 1]", "assert twice(1) == 3"])
    assert [o.passed for o in res.outcomes] == [True, True, False, True, False]


@pytest.mark.integration
def test_infinite_loop_times_out():
    res = _run("while True:\n    pass")
    assert res.passed == 0 and res.outcomes[0].reason == "timeout"


@pytest.mark.integration
def test_memory_bomb_is_capped():
    res = _run("blocks = []\nwhile True:\n    blocks.append(bytearray(10**7))\nprint('done')")
    assert res.passed == 0 and "MemoryError" in res.outcomes[0].stderr_tail


@pytest.mark.integration
def test_fork_bomb_is_contained():
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    res = _run(code)
    assert res.passed == 0


@pytest.mark.integration
def test_detached_daemon_is_killed():
    # a child that leaves the process group and outlives the test must still be killed
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('done')"
    res = _run(code)
    assert res.passed == 1


@pytest.mark.integration
def test_socket_connection_fails():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    port = srv.getsockname()[1]
    py = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'x')\nprint('done')"
    raw = (  # bypasses Python's socket module: only the network namespace stops it
        "import ctypes, struct\nlibc = ctypes.CDLL(None, use_errno=True)\nfd = libc.socket(2, 1, 0)\n"
        f"addr = struct.pack('=H', 2) + struct.pack('!H', {port}) + bytes([127, 0, 0, 1]) + bytes(8)\n"
        "print('done' if libc.connect(fd, addr, 16) == 0 else 'refused')"
    )
    try:
        assert _run(py).passed == 0
        if sandbox_layers().get("net_ns"):
            assert _run(raw).passed == 0
        # a completed connection would wait in the backlog: there must be none
        srv.setblocking(False)
        with pytest.raises(BlockingIOError):
            srv.accept()
    finally:
        srv.close()


@pytest.mark.integration
def test_writes_outside_temp_dir_fail(tmp_path):
    targets = [tmp_path / f"escape-{uuid.uuid4().hex}", f"/tmp/arealite-escape-{uuid.uuid4().hex}"]
    if os.path.isdir("/dev/shm"):
        targets.append(f"/dev/shm/arealite-escape-{uuid.uuid4().hex}")
    layers = sandbox_layers()
    for t in targets:
        res = _run(f"open({str(t)!r}, 'w').write('x')\nprint('done')")
        if layers.get("readonly_fs") or layers.get("uid_drop"):
            assert res.passed == 0, t
        assert not os.path.exists(t), t
    # the private temp dir itself is writable
    assert _run("open('scratch.txt', 'w').write('ok')\nprint(open('scratch.txt').read() and 'done')").passed == 1


@pytest.mark.integration
def test_output_flood_and_big_file_are_capped():
    assert _run("while True:\n    print('x' * 1000)").outcomes[0].reason == "output limit exceeded"
    res = _run("f = open('big.bin', 'wb')\nwhile True:\n    f.write(b'x' * 10**6)")
    assert res.passed == 0


@pytest.mark.integration
def test_whole_run_budget_and_partial_credit():
    code = "import sys\nn = int(input())\nwhile n == 2:\n    pass\nprint(n)"
    tests = [{"input": "1", "output": "1"}, {"input": "2", "output": "2"}, {"input": "3", "output": "3"}]
    res = _run(code, tests, SandboxLimits(timeout_per_test=0.5))
    assert [o.passed for o in res.outcomes] == [True, False, True]
    assert res.fraction == pytest.approx(2 / 3)


@pytest.mark.integration
def test_layers_on_this_host_are_reported():
    layers = sandbox_layers()
    assert layers["probe_ok"]
    if os.geteuid() == 0:  # this project's machines run as root with namespaces available
        for key in ("pid_ns", "net_ns", "mount_ns", "readonly_fs", "uid_drop", "private_tmpfs"):
            assert layers.get(key), (key, layers)


def test_bad_tests_are_clear_errors():
    with pytest.raises(ValueError, match="not a recognised"):
        normalize_tests([{"foo": 1}])
    with pytest.raises(ValueError, match="differ in length"):
        normalize_tests({"inputs": ["1"], "outputs": []})
    assert normalize_tests('{"inputs": ["1"], "outputs": ["2"]}') == [
        {"kind": "stdio", "input": "1", "output": "2"}]


@pytest.mark.integration
def test_closed_stdout_then_loop_still_times_out():
    res = _run("import os\nos.close(1)\nos.close(2)\nwhile True:\n    pass")
    assert res.outcomes[0].reason == "timeout"


@pytest.mark.integration
def test_site_packages_only_when_allowed():
    code = "import yaml\nprint(yaml.safe_load('a: 1')['a'])"
    tests = [{"input": "", "output": "1"}]
    assert _run(code, tests).passed == 0
    assert _run(code, tests, SandboxLimits(timeout_per_test=5.0, allow_site_packages=True)).passed == 1


def test_stale_workdirs_of_dead_callers_are_swept(tmp_path, monkeypatch):
    import subprocess
    import sys

    import workflows.sandbox as sbx

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    monkeypatch.setattr(sbx.tempfile, "gettempdir", lambda: str(tmp_path))
    (tmp_path / f"arealite-sbx-{dead}-abc").mkdir()
    (tmp_path / f"arealite-sbx-{os.getpid()}-live").mkdir()
    monkeypatch.setattr(sbx, "_last_sweep", float("-inf"))
    sbx._sweep_stale_workdirs()
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"arealite-sbx-{os.getpid()}-live"]
