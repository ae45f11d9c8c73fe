"""The code sandbox's process side: ``python -I -S -B runner.py`` reads one JSON job on stdin and
writes one JSON line per test (then a ``done`` line) on stdout. Stdlib only.

Process tree (see ``workflows/sandbox/__init__.py`` for the caller and the list of defences):

    caller ── R0 (this script; enters namespaces, dies with the caller)
                └─ R1 supervisor: PID 1 of a new pid namespace, sets up mounts, runs the tests
                     └─ one fresh ``python -I -S`` per test, as an unprivileged uid with rlimits

The untrusted code never shares memory with the supervisor, so it cannot read the expected
outputs; stdin/stdout and function-call tests are judged by the supervisor.
"""

from __future__ import annotations

import json
import math
import os
import resource
import select
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import isolation as iso  # noqa: E402  (a sibling file; -I keeps the script dir off sys.path)

MARK = "@@arealite-result@@"
UID_BASE = 2_000_000_000  # per-run uids above any real account: RLIMIT_NPROC counts only us

# Runs inside the per-test interpreter before the solution: blocks sockets in Python (the
# network namespace blocks them for real where available), then runs the solution.
BOOT = r"""
import sys
def _arealite_boot():
    import _socket, socket
    def _denied(*a, **k):
        raise PermissionError(1, "network access is disabled in this sandbox")
    class _NoNetwork(_socket.socket):
        def __init__(self, *a, **k):
            _denied()
    _socket.socket = socket.socket = socket.SocketType = _NoNetwork
    for _m in (socket, _socket):
        for _n in ("create_connection", "create_server", "getaddrinfo", "fromfd", "socketpair"):
            if hasattr(_m, _n):
                setattr(_m, _n, _denied)
    kind, mark = sys.argv[1], sys.argv[2]
    sys.path[:0] = sys.argv[3:]
    sys.argv = ["solution.py"]
    with open("solution.py", encoding="utf-8") as f:
        code = compile(f.read(), "solution.py", "exec")
    payload = None if kind == "stdio" else __import__("json").loads(sys.stdin.read())
    return kind, mark, code, payload
_kind, _mark, _code, _payload = _arealite_boot()
_g = {"__name__": "__main__" if _kind == "stdio" else "solution", "__builtins__": __builtins__}
exec(_code, _g)
if _kind == "call":
    import json as _json
    _fn = _g.get(_payload["fn_name"])
    if _fn is None and "Solution" in _g:
        _fn = getattr(_g["Solution"](), _payload["fn_name"])
    _res = _fn(*_payload["args"])
    _out = _json.dumps(_res, default=lambda o: sorted(o) if isinstance(o, (set, frozenset)) else str(o))
    sys.stdout.write("\n" + _mark + _out + "\n")
elif _kind == "assert":
    exec(compile(_payload["assert"], "test", "exec"), _g)
    sys.stdout.write("\n" + _mark + "true\n")
sys.stdout.flush()
"""


def emit(obj: dict) -> None:
    os.write(1, (json.dumps(obj) + "\n").encode())


# --------------------------------------------------------------------------- judging


def _tokens_match(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    return math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-6)


def outputs_match(got: str, expected: str) -> bool:
    """Line by line, trailing whitespace and trailing blank lines ignored; numbers within 1e-6."""
    g = [ln.rstrip() for ln in got.rstrip().splitlines()]
    e = [ln.rstrip() for ln in str(expected).rstrip().splitlines()]
    if g == e:
        return True
    if len(g) != len(e):
        return False
    for lg, le in zip(g, e):
        tg, te = lg.split(), le.split()
        if len(tg) != len(te) or not all(_tokens_match(a, b) for a, b in zip(tg, te)):
            return False
    return True


def values_match(got, expected) -> bool:
    if isinstance(got, bool) or isinstance(expected, bool):
        return got == expected
    if isinstance(got, (int, float)) and isinstance(expected, (int, float)):
        return math.isclose(got, expected, rel_tol=1e-6, abs_tol=1e-6)
    if isinstance(got, list) and isinstance(expected, (list, tuple)):
        return len(got) == len(expected) and all(values_match(a, b) for a, b in zip(got, expected))
    if isinstance(got, dict) and isinstance(expected, dict):
        return got.keys() == expected.keys() and all(values_match(got[k], expected[k]) for k in got)
    return got == expected


def judge(test: dict, rc: int, out: str) -> tuple[bool, str]:
    if rc != 0:
        return False, (f"killed by signal {-rc}" if rc < 0 else f"runtime error (exit {rc})")
    if test["kind"] == "stdio":
        return (True, "ok") if outputs_match(out, test["output"]) else (False, "wrong answer")
    lines = [ln for ln in out.splitlines() if ln.startswith(MARK)]
    if not lines:
        return False, "no result"
    if test["kind"] == "assert":
        return (True, "ok") if lines[-1] == MARK + "true" else (False, "no result")
    try:
        got = json.loads(lines[-1][len(MARK):])
    except ValueError:
        return False, "unreadable result"
    return (True, "ok") if values_match(got, test["expected"]) else (False, "wrong answer")


# --------------------------------------------------------------------------- one test


class Supervisor:
    def __init__(self, job: dict, layers: dict, uid: int, uid_drop: bool):
        self.job, self.layers, self.uid, self.uid_drop = job, layers, uid, uid_drop
        self.workdir = job["workdir"]
        lim = job["limits"]
        self.nproc = lim["max_procs"] if uid_drop else iso.count_processes_of(os.getuid()) + lim["max_procs"]

    def _exec_child(self, test: dict, stdin_fd: int, out_w: int, err_w: int) -> None:
        lim = self.job["limits"]
        try:
            os.setpgid(0, 0)
            os.dup2(stdin_fd, 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            os.closerange(3, 1 << 16)
            os.chdir(self.workdir)
            mem = lim["memory_mb"] << 20
            cpu = math.ceil(test.get("timeout", lim["timeout_per_test"])) + 1
            for res, val in (
                (resource.RLIMIT_AS, (mem, mem)),
                (resource.RLIMIT_CPU, (cpu, cpu + 1)),
                (resource.RLIMIT_FSIZE, (lim["max_file_mb"] << 20,) * 2),
                (resource.RLIMIT_NOFILE, (64, 64)),
                (resource.RLIMIT_CORE, (0, 0)),
                (resource.RLIMIT_NPROC, (self.nproc, self.nproc)),
            ):
                resource.setrlimit(res, val)
            iso.drop_capabilities()
            if self.uid_drop:
                os.setgroups([])
                os.setresgid(self.uid, self.uid, self.uid)
                os.setresuid(self.uid, self.uid, self.uid)
            iso.die_with_parent()
            env = {"PATH": "/usr/bin:/bin", "HOME": self.workdir, "TMPDIR": self.workdir,
                   "LANG": "C.UTF-8"}
            py = self.job["python"]
            os.execve(py, [py, "-I", "-S", "-B", "-c", BOOT, test["kind"], MARK,
                           *self.job.get("extra_paths", [])], env)
        except BaseException as e:  # noqa: BLE001 - report and never return into the supervisor
            os.write(2, f"sandbox setup failed: {e!r}\n".encode())
        os._exit(126)

    def kill_all(self, pid: int) -> None:
        """Kill the test process and everything it started, however it detached itself."""
        if os.getpid() == 1:  # init of our own pid namespace: -1 means 'everyone in it'
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                pass
        elif self.uid_drop:  # every process of the per-run uid, signalled as that uid
            k = os.fork()
            if k == 0:
                try:
                    os.setresgid(self.uid, self.uid, self.uid)
                    os.setresuid(self.uid, self.uid, self.uid)
                    if os.getuid() == os.geteuid() == self.uid != 0:
                        os.kill(-1, signal.SIGKILL)
                except OSError:
                    pass
                finally:
                    os._exit(0)
            os.waitpid(k, 0)
        else:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.reap(block_s=0.5)

    @staticmethod
    def reap(block_s: float = 0.0) -> None:
        end = time.monotonic() + block_s
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                if time.monotonic() >= end:
                    return
                time.sleep(0.005)

    def _clear_workdir(self) -> None:
        for root, dirs, files in os.walk(self.workdir, topdown=False):
            for f in files:
                os.unlink(os.path.join(root, f))
            for d in dirs:
                p = os.path.join(root, d)
                os.unlink(p) if os.path.islink(p) else os.rmdir(p)

    def run_one(self, test: dict) -> dict:
        lim = self.job["limits"]
        timeout = float(test.get("timeout", lim["timeout_per_test"]))
        self._clear_workdir()
        with open(os.path.join(self.workdir, "solution.py"), "w", encoding="utf-8") as f:
            f.write(self.job["code"])
        stdin_fd = os.memfd_create("stdin")
        data = test["input"] if test["kind"] == "stdio" else json.dumps(test["payload"])
        os.write(stdin_fd, str(data).encode())
        os.lseek(stdin_fd, 0, os.SEEK_SET)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        t0 = time.monotonic()
        pid = os.fork()
        if pid == 0:
            self._exec_child(test, stdin_fd, out_w, err_w)
        for fd in (stdin_fd, out_w, err_w):
            os.close(fd)
        out, err, status, reason = bytearray(), bytearray(), None, None
        open_fds = [out_r, err_r]
        while open_fds:
            left = t0 + timeout - time.monotonic()
            if left <= 0:
                reason = "timeout"
                break
            ready, _, _ = select.select(open_fds, [], [], min(left, 0.05))
            for fd in ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    open_fds.remove(fd)
                elif fd == out_r:
                    out += chunk
                else:
                    err = (err + chunk)[-4096:]
            if len(out) > lim["max_output_bytes"]:
                reason = "output limit exceeded"
                break
            if status is None:
                done, st = os.waitpid(pid, os.WNOHANG)
                if done:
                    status = st
            elif not ready:  # exited and nothing more pending: a leftover child holds the pipe
                break
        while status is None and reason is None:  # pipes closed, process maybe still running
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
            elif time.monotonic() >= t0 + timeout:
                reason = "timeout"
            else:
                time.sleep(0.005)
        self.kill_all(pid)  # also removes anything it left behind
        for fd in (out_r, err_r):
            os.close(fd)
        seconds = round(time.monotonic() - t0, 3)
        if reason is not None:
            return {"passed": False, "reason": reason, "seconds": seconds}
        passed, why = judge(test, os.waitstatus_to_exitcode(status), out.decode("utf-8", "replace"))
        res = {"passed": passed, "reason": why, "seconds": seconds}
        if not passed:  # for debugging a reward: what the program said (never the expectation)
            res["stderr_tail"] = err[-400:].decode("utf-8", "replace")
            res["stdout_tail"] = out[-400:].decode("utf-8", "replace")
        return res


# --------------------------------------------------------------------------- setup


def setup_and_run(job: dict, layers: dict, run_uid: int) -> int:
    is_root = os.geteuid() == 0 and not layers.get("user_ns")
    uid_drop = is_root
    workdir = job["workdir"]
    if layers.get("mount_ns"):
        try:
            if layers.get("pid_ns"):
                iso.mount("proc", "/proc", "proc", iso.MS_NOSUID | iso.MS_NODEV | iso.MS_NOEXEC)
                layers["private_proc"] = True
        except OSError:
            layers["private_proc"] = False
        try:
            owner = run_uid if uid_drop else 0
            iso.private_tmpfs(workdir, job["limits"]["tmpfs_mb"], owner, owner)
            layers["private_tmpfs"] = True
        except OSError:
            layers["private_tmpfs"] = False
        if uid_drop:
            try:
                iso.expose_paths(job["expose"], run_uid, run_uid)
            except OSError:
                pass
        try:
            layers["readonly_fs"], failed = iso.make_everything_readonly(workdir)
            if failed:
                layers["readonly_failed"] = failed
        except OSError:
            layers["readonly_fs"] = False
    else:
        layers.update(private_proc=False, private_tmpfs=False, readonly_fs=False)
    if uid_drop:
        if not layers.get("private_tmpfs"):
            os.chown(workdir, run_uid, run_uid)
        # Without a way to reach the interpreter as that uid, fall back to root without
        # capabilities rather than failing every test.
        if any(iso.blocking_ancestor(p, run_uid, run_uid) for p in [job["python"], *job["expose"]]):
            uid_drop = False
    layers["uid_drop"] = uid_drop
    layers["nproc_limit"] = uid_drop or not is_root  # root ignores RLIMIT_NPROC
    iso.prctl(iso.PR_SET_DUMPABLE, 0)  # the tests cannot ptrace or read our memory
    try:
        iso.prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: orphans come to us to be reaped
    except OSError:
        pass
    sup = Supervisor(job, layers, run_uid, uid_drop)
    emit({"layers": layers})
    for i, test in enumerate(job["tests"]):
        emit({"test": i, **sup.run_one(test)})
    emit({"done": True})
    return 0


def main() -> int:
    job = json.loads(sys.stdin.buffer.read())
    iso.die_with_parent()
    run_uid = UID_BASE + os.getpid()
    layers = iso.enter_namespaces(os.geteuid() == 0)
    if not layers.get("pid_ns"):
        return setup_and_run(job, layers, run_uid)
    pid = os.fork()  # the child is PID 1 of the new namespace: when it exits, all of it dies
    if pid == 0:
        code = 1
        try:
            iso.die_with_parent()
            code = setup_and_run(job, layers, run_uid)
        except BaseException as e:  # noqa: BLE001
            os.write(2, f"sandbox supervisor failed: {e!r}\n".encode())
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) & 0xFF


if __name__ == "__main__":
    sys.exit(main())
