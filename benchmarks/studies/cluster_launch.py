"""Launch to first step, and what a failed server costs, for the three launchers side by side.

    python -m benchmarks.studies.cluster_launch [--steps N] [--no-failure]

On the toy GRPO job (tiny model, 4 prompts x 2 samples a step, two embedded servers, one
trainer), one after the other in one run so the figures share the machine's load:

- local: ``python -m arealite.launcher.local`` (``arealite train``);
- ray: ``python -m arealite.launcher.ray`` starting its own local Ray (no ``--address``), so
  Ray's own start-up is counted; servers and trainer are Ray actors;
- slurm: ``sbatch --wait deploy/slurm/grpo.sbatch`` (servers and trainer as two job steps),
  only when a Slurm answers (``make test-slurm`` starts one: run this benchmark with
  SLURM_CONF set while it is up, or ``deploy/slurm/local_cluster.sh start`` first).

Launch to first step: from starting the command until step 1 is in the run's metrics.
Failed server: one of the two servers' processes is SIGKILLed after step 3, in runs of three
times the steps. local: the run goes on with one server (``launcher.max_server_failures=1``):
whether it finishes, and its time. ray: ``launcher.ray.server_restarts=1``: seconds from the kill until
the client re-admitted the restarted server at the current weights (same address). slurm: the
servers step ends with the dead server (the template's default ``max_server_failures=0``), so
the job fails: seconds from the kill until the job has ended.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from benchmarks.harness.grpo_runs import ROOT, last_step, log_tail, small_run, wait_exit, wait_until

CONFIG = str(ROOT / "configs" / "toy_grpo.yaml")
TIMEOUT = 600


@contextlib.contextmanager
def spawn(cmd: list[str], env: dict | None = None):
    """``cmd`` in its own process group, output to a temp log; the group is killed after."""
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    try:
        yield proc, log.name
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(15)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def _servers(token: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "servers.launch_server" in cmd and token in cmd:
            out.append(p)
    return out


def _kill_one_server(token: str) -> None:
    victim = sorted(_servers(token), key=lambda p: p.pid)[-1]
    os.killpg(os.getpgid(victim.pid), signal.SIGKILL)


def _run(name: str, cmd: list[str], fileroot: Path, trial: str, kill: bool,
         wait_text: str | None = None, env: dict | None = None) -> dict:
    r = _one_run(name, cmd, fileroot, trial, kill, wait_text, env)
    print(f"# {name}{' with a server killed' if kill else ''}: {({k: round(v, 1) if isinstance(v, float) else v for k, v in r.items() if k != 'log'})}", flush=True)
    return r


def _one_run(name: str, cmd: list[str], fileroot: Path, trial: str, kill: bool,
             wait_text: str | None, env: dict | None) -> dict:
    """One run: seconds to step 1, to the end, and (with ``kill``) to ``wait_text`` after it."""
    res: dict = {}
    with spawn(cmd, env) as (proc, log):
        t0 = time.monotonic()
        wait_until(lambda: last_step(fileroot, trial) >= 1, proc, log, TIMEOUT, f"{name} step 1",
                   poll=0.05)
        res["first_step"] = time.monotonic() - t0
        if kill:
            wait_until(lambda: last_step(fileroot, trial) >= 3, proc, log, TIMEOUT, "step 3")
            _kill_one_server(str(fileroot.parent))  # slurm: servers write beside outputs/
            tk = time.monotonic()
            while wait_text and proc.poll() is None:
                if wait_text in log_tail(log, 3000):
                    res["recovered"] = time.monotonic() - tk
                    break
                time.sleep(0.1)
        res["code"] = wait_exit(proc, log, TIMEOUT)
        res["total"] = time.monotonic() - t0
        if kill:
            res["after_kill"] = time.monotonic() - tk
        res["log"] = log_tail(log, 60)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--no-failure", action="store_true", help="only launch to first step")
    args = ap.parse_args()
    from arealite.demo.tiny import build_tiny_model
    from arealite.demo.toy_math import write_toy_math

    tmp = Path(tempfile.mkdtemp(prefix="cluster-launch-"))
    model = build_tiny_model(tmp / "model")
    write_toy_math(tmp / "data", n_train=400, n_valid=4, seed=0)
    common = ["launcher.n_servers=2", "weight_update.type=disk", "rollout.health_check_interval=1"]
    env = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    slurm = shutil.which("sbatch") and subprocess.run(
        ["sinfo", "-h"], capture_output=True).returncode == 0
    rows = []
    for kill in ([False] if args.no_failure else [False, True]):
        tag = "kill" if kill else "ok"
        # with a kill, long enough for a restarted server to come back before the end
        over = [*small_run(model, tmp / "data", args.steps * (3 if kill else 1), epochs=1),
                *common]
        root = tmp / f"local-{tag}"
        rows.append(("local", kill, _run("local", [
            sys.executable, "-m", "arealite.launcher.local", CONFIG, f"cluster.fileroot={root}",
            "trial_name=t", *over, "launcher.max_server_failures=1"], root, "t", kill)))
        root = tmp / f"ray-{tag}"
        rows.append(("ray", kill, _run("ray", [
            sys.executable, "-m", "arealite.launcher.ray", CONFIG, f"cluster.fileroot={root}",
            "trial_name=t", *over, "launcher.ray.server_restarts=1"], root, "t", kill,
            wait_text="re-admitted to the pool" if kill else None, env=env)))
        if slurm:
            root = tmp / f"slurm-{tag}"
            root.mkdir()
            senv = {"SERVERS_ROOT": str(root / "servers"), "N_SERVER_NODES": "1",
                    "AREALITE_DEPLOY": str(ROOT / "deploy" / "slurm"), "PYTHON": sys.executable,
                    "GPUS_PER_NODE": "2", "GPUS_PER_SERVER": "1", "POLL_SECS": "1",
                    "PYTHONPATH": str(ROOT)}
            rows.append(("slurm", kill, _run("slurm", [
                "sbatch", "--wait", "--nodes=1", "--cpus-per-task=2", "--gpus-per-node=0",
                f"--output={root / 'job.out'}", f"--chdir={root}",
                str(ROOT / "deploy" / "slurm" / "grpo.sbatch"), CONFIG, "trial_name=t", *over,
                "launcher.gpus_per_server=0", "launcher.server_backend=embedded",
                "launcher.server_host=127.0.0.1"], root / "outputs", "t", kill, env=senv)))
    print(f"toy GRPO, {args.steps} steps, 2 embedded servers + 1 trainer, one machine "
          f"({os.cpu_count()} cores){'' if slurm else '; no Slurm answering: slurm skipped'}")
    print(f"{'launcher':<8} {'launch to first step (s)':>25} {'whole run (s)':>14} {'exit':>5}")
    for name, kill, r in rows:
        if not kill:
            print(f"{name:<8} {r['first_step']:>25.1f} {r['total']:>14.1f} {r['code']:>5}")
    for name, kill, r in rows:
        if not kill:
            continue
        if name == "ray":
            back = (f"re-admitted {r['recovered']:.1f} s after the kill" if "recovered" in r
                    else "not re-admitted before the run ended")
            what = (f"server restarted by Ray, {back}; run {r['total']:.1f} s "
                    f"({3 * args.steps} steps), exit {r['code']}")
        elif name == "local":
            what = (f"run went on with 1 server: {r['total']:.1f} s ({3 * args.steps} steps), "
                    f"exit {r['code']}")
        else:
            what = f"job ended {r['after_kill']:.1f} s after the kill, exit {r['code']}"
        print(f"failed server, {name}: {what}")
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
