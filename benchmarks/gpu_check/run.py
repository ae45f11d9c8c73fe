"""Run every part of the device check, each in its own process group under its own time limit,
so a part that crashes or hangs loses only its own figures; write ``gpu_check.json`` (every
part's status, seconds and figures) and ``gpu_check.log`` (every part's output) to ``--out``.

    python -m benchmarks.gpu_check.run --device cuda --out DIR     # on the lent GPU (< 10 min)
    python -m benchmarks.gpu_check.run --device cpu --quick        # the same parts, tiny, here

A part is skipped, not started, when what is left of ``--budget`` is less than its limit; the
results file is rewritten after every part, so a run stopped from outside keeps what finished.
Exit status 0 when every part that ran passed, 1 otherwise, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LONG_CONTEXT = ROOT / "benchmarks" / "micro" / "long_context.py"


def cuda_test_files() -> list[str]:
    """The test files that mark tests ``cuda``: ``pytest -m cuda`` over these alone, since
    collecting the whole suite imports packages the lent machine lacks (ray, vllm, openai, ...).
    On CPU they are collected and skip: all the quick form can prove of them."""
    return sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "tests").rglob("test_*.py")
        if "mark.cuda" in p.read_text(errors="replace")
    )


@dataclass
class Part:
    name: str
    limit_cuda: int  # seconds
    limit_cpu: int

    def command(self, device: str, quick: bool, work: Path) -> list[str] | None:
        py = [sys.executable]
        figures = str(work / f"{self.name}.json")
        q = ["--quick"] if quick else []
        if self.name == "cuda_tests":
            files = cuda_test_files()
            return [
                *py,
                "-m",
                "pytest",
                "-m",
                "cuda",
                "-q",
                "-p",
                "no:cacheprovider",
                "-o",
                "addopts=",
                "--junitxml",
                str(work / "cuda_tests.xml"),
                *files,
            ]
        if self.name == "long_context":
            if not LONG_CONTEXT.is_file():
                return None
            args = (
                [
                    "--device",
                    "cuda",
                    "--model",
                    "qwen3-0.6b",
                    "--budgets",
                    "4096,16384,65536",
                    "--seq-len",
                    "0",
                    "--ckpt",
                    "1",
                ]
                if device == "cuda"
                else ["--budgets", "1024", "--ckpt", "0", "--updates", "1"]
            )
            return [*py, "-m", "benchmarks.micro.long_context", *args, "--json", figures]
        return [
            *py,
            "-m",
            f"benchmarks.gpu_check.{self.name}",
            "--device",
            device,
            *q,
            "--json",
            figures,
        ]


# Limits: on cuda, estimates (no GPU has run the check yet) held inside the device call's 540 s
# budget; on cpu, about twice what each part took beside a busy process on the 2-core machine
# (long_context: 80 s quiet, 209 s busy; colocated: over 240 s busy with its own warm start).
PARTS = [
    Part("device_info", 60, 60),
    Part("cuda_tests", 150, 120),
    Part("colocated", 240, 480),
    Part("decode", 120, 180),
    Part("long_context", 90, 420),
]


def junit_counts(path: Path) -> dict[str, float]:
    """passed / failed / skipped / errors of a pytest junit file."""
    import xml.etree.ElementTree as ET

    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    return {
        "tests": n["tests"],
        "failed": n["failures"],
        "errors": n["errors"],
        "skipped": n["skipped"],
        "passed": n["tests"] - n["failures"] - n["errors"] - n["skipped"],
    }


def run_part(part: Part, cmd: list[str], limit: int, work: Path, log) -> dict:
    """One part in its own process group, its output into ``log``; killed at ``limit``."""
    log.write(f"\n===== {part.name}: {' '.join(cmd)} (limit {limit} s)\n")
    log.flush()
    t0 = time.monotonic()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    status = "ok"
    try:
        rc = proc.wait(timeout=limit)
        if rc != 0:
            status = "failed"
    except subprocess.TimeoutExpired:
        # SIGTERM first: a launcher stops the servers and trainers it started in their own
        # sessions (out of this group), which would otherwise hold the device for the next part
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            rc = proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
        status = "timeout"
    secs = time.monotonic() - t0
    res: dict = {"status": status, "rc": rc, "seconds": round(secs, 1), "limit_s": limit}
    fig = work / f"{part.name}.json"
    if fig.is_file():
        try:
            res["figures"] = json.loads(fig.read_text())
        except ValueError as e:
            res["figures_error"] = str(e)
    xml = work / "cuda_tests.xml"
    if part.name == "cuda_tests" and xml.is_file():
        res["figures"] = junit_counts(xml)
        if res["figures"]["failed"] or res["figures"]["errors"]:
            res["status"] = "failed"
        elif rc == 5:  # pytest: nothing collected
            res["status"] = "failed"
    log.write(f"===== {part.name}: {status} in {secs:.1f} s\n")
    log.flush()
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", choices=["cuda", "cpu"], required=True)
    ap.add_argument("--quick", action="store_true", help="tiny shapes (the CPU form)")
    ap.add_argument(
        "--out",
        default=None,
        help="folder for gpu_check.json and gpu_check.log (default: benchmarks/results/gpu_check)",
    )
    ap.add_argument("--budget", type=int, default=None,
                    help="seconds for all parts together (default: 540 on cuda, inside the device "
                         "tool's 600 s call; on cpu the sum of the parts' CPU limits)")
    ap.add_argument(
        "--parts",
        default=",".join(p.name for p in PARTS),
        help=f"some of {','.join(p.name for p in PARTS)}",
    )
    a = ap.parse_args(argv)
    names = [n for n in a.parts.split(",") if n]
    unknown = sorted(set(names) - {p.name for p in PARTS})
    if unknown or not names:
        print(f"gpu_check: --parts: unknown {unknown or 'empty'}", file=sys.stderr)
        return 2
    if a.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("gpu_check: --device cuda but torch sees no CUDA device", file=sys.stderr)
            return 2
    if a.budget is None:
        a.budget = 540 if a.device == "cuda" else sum(p.limit_cpu for p in PARTS if p.name in names)
    out = Path(a.out or ROOT / "benchmarks" / "results" / "gpu_check")
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"device": a.device, "quick": a.quick, "budget_s": a.budget, "parts": {}}
    t_start = time.monotonic()
    ok = True
    with (
        tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp,
        open(out / "gpu_check.log", "w") as log,
    ):
        work = Path(tmp)
        for part in (p for p in PARTS if p.name in names):
            limit = part.limit_cuda if a.device == "cuda" else part.limit_cpu
            left = a.budget - (time.monotonic() - t_start)
            cmd = part.command(a.device, a.quick, work)
            if cmd is None:
                res = {
                    "status": "absent",
                    "why": f"{LONG_CONTEXT.relative_to(ROOT)} not in this tree",
                }
            elif left < min(limit, 30):
                res = {"status": "skipped", "why": f"{left:.0f} s of the budget left"}
            else:
                res = run_part(part, cmd, int(min(limit, left)), work, log)
            ok &= res["status"] in ("ok", "absent")
            results["parts"][part.name] = res
            results["seconds"] = round(time.monotonic() - t_start, 1)
            (out / "gpu_check.json").write_text(json.dumps(results, indent=1, sort_keys=True))
            print(
                f"{part.name:>13}: {res['status']:>8} {res.get('seconds', 0):7.1f} s  "
                f"{json.dumps(res.get('figures', res.get('why', '')))[:400]}",
                flush=True,
            )
    print(f"gpu_check: {results['seconds']} s; {out / 'gpu_check.json'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
