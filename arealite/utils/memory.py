"""Memory figures of this host and its processes, read from ``/proc`` (Linux)."""

from __future__ import annotations


def _proc_field(path: str, key: str) -> int:
    """The ``key:`` line of a ``/proc`` file, in kB (0 when absent)."""
    with open(path) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def host_available_bytes() -> int:
    """``MemAvailable``: what the host could hand out without swapping."""
    return _proc_field("/proc/meminfo", "MemAvailable") * 1024


def rss_mib(pid: int) -> float:
    """A process's resident set size (``VmRSS``) in MiB."""
    return _proc_field(f"/proc/{pid}/status", "VmRSS") / 1024
