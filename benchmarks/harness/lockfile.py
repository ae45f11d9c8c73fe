"""The committed lock (``requirements/*.txt``, written by ``make lock`` with uv): the exact
version of every package an environment installs, read back for the checks that the installed
environment and the device check's wheels are the lock's."""

from __future__ import annotations

import re
from pathlib import Path

# the packaging standards' name comparison (PEP 503), as pip applies it
from packaging.utils import canonicalize_name as canonical

ROOT = Path(__file__).resolve().parents[2]
LOCKS = ROOT / "requirements"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)")


def read_lock(*names: str) -> dict[str, str]:
    """``{canonical name: version}`` of the pins in ``requirements/<name>.txt`` (several files
    merged: a package pinned twice must be pinned alike, or this raises)."""
    pins: dict[str, str] = {}
    for name in names:
        for line in (LOCKS / f"{name}.txt").read_text().splitlines():
            m = _PIN.match(line)
            if not m:
                continue
            key, version = canonical(m.group(1)), m.group(2)
            if pins.setdefault(key, version) != version:
                raise ValueError(f"{key} is locked at {pins[key]} and {version}")
    return pins
