"""Prepare what the device check needs to travel: the wheels of the packages ``wheels.txt``
names, at the versions the lock pins (``requirements/run.txt``, so the two cannot disagree;
Python 3.12, x86-64 manylinux, no dependencies resolved) downloaded into ``.whl/`` (git-ignored,
named in the device call's ``carry``), then the size of what travels checked against the
device tool's 64 MiB: the files git would send (tracked, and untracked but not ignored) plus
``.whl/``.

    python -m benchmarks.gpu_check.prepare [--dest .whl] [--limit-mib 64]

Exit status 0 when everything is there and fits, 1 otherwise.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from benchmarks.harness.lockfile import canonical, read_lock

ROOT = Path(__file__).resolve().parents[2]
WHEELS = Path(__file__).with_name("wheels.txt")
PLATFORMS = [
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]


def pinned() -> list[str]:
    """``name==version`` for every package ``wheels.txt`` names, the version from the lock."""
    lock = read_lock("run")
    names = [ln.split("#")[0].strip() for ln in WHEELS.read_text().splitlines()]
    return [f"{n}=={lock[canonical(n)]}" for n in names if n]


def have(dest: Path, spec: str) -> bool:
    name, version = spec.split("==")
    stem = name.replace("-", "_").lower()
    return any(w.name.lower().startswith(f"{stem}-{version}-") for w in dest.glob("*.whl"))


def download(dest: Path, specs: list[str]) -> int:
    missing = [s for s in specs if not have(dest, s)]
    if not missing:
        return 0
    plat = [x for p in PLATFORMS for x in ("--platform", p)]
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
        *plat,
        "-d",
        str(dest),
        *missing,
    ]
    print(" ".join(cmd), flush=True)
    return subprocess.run(cmd).returncode


def tree_bytes() -> int:
    """Bytes of the files a device call sends: tracked, plus untracked files git does not ignore."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    total = 0
    for name in out.decode().split("\0"):
        p = ROOT / name
        if name and p.is_file() and not p.is_symlink():
            total += p.stat().st_size
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--dest", default=str(ROOT / ".whl"))
    ap.add_argument("--limit-mib", type=float, default=64.0)
    a = ap.parse_args(argv)
    dest = Path(a.dest)
    dest.mkdir(parents=True, exist_ok=True)
    specs = pinned()
    if download(dest, specs) != 0:
        print("gpu_check prepare: pip download failed", file=sys.stderr)
        return 1
    absent = [s for s in specs if not have(dest, s)]
    wheels = sum(w.stat().st_size for w in dest.glob("*.whl"))
    tree = tree_bytes()
    total = (wheels + tree) / 2**20
    print(
        f"wheels {len(specs) - len(absent)}/{len(specs)} in {dest}: {wheels / 2**20:.1f} MiB; "
        f"tree {tree / 2**20:.1f} MiB; together {total:.1f} MiB of {a.limit_mib:g}"
    )
    if absent:
        print(f"gpu_check prepare: missing {absent}", file=sys.stderr)
    if total > a.limit_mib:
        print("gpu_check prepare: too big to travel", file=sys.stderr)
    return 0 if not absent and total <= a.limit_mib else 1


if __name__ == "__main__":
    sys.exit(main())
