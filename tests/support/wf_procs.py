"""Finding sandbox processes that outlived their run (tests assert there are none)."""

from __future__ import annotations

import os


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def _owned_elsewhere(pid: int, sandbox: set[int]) -> bool:
    """Whether ``pid``'s nearest ancestor outside the sandbox is a live process other than this
    one and init: another test process's sandbox run still going (CI runs test files side by
    side). A leaked process is re-parented to init, so it always counts."""
    me = os.getpid()
    try:
        while pid in sandbox:
            pid = _parent(pid)
    except (OSError, ValueError, IndexError):
        return False
    return pid not in (0, 1, me)


def sandbox_processes() -> list[int]:
    """Processes of a sandbox still alive on this machine: any per-run uid (>= 2e9), or a
    runner/supervisor (those run as the caller's uid), except those of another test process's
    sandbox run that is still going."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.stat(f"/proc/{d}").st_uid >= 2_000_000_000:
                    out.append(int(d))
                    continue
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if b"workflows/sandbox/runner.py" in f.read():
                        out.append(int(d))
            except OSError:
                pass
    return [p for p in out if not _owned_elsewhere(p, set(out))]
