"""When and on what a benchmark's figures were measured, kept beside them: the commit of the code
and the machine's load while the run went on (these machines are shared, so a time figure without
its load says little)."""

from __future__ import annotations

import os
import subprocess
import threading

from benchmarks.harness.paths import ROOT


def head_commit() -> str:
    """The short hash of the checkout's HEAD (``unknown`` outside a git checkout)."""
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                         text=True)
    return out.stdout.strip() if out.returncode == 0 else "unknown"


class LoadWatch:
    """The machine's 1-minute load average sampled every ``every`` seconds while a run goes on:
    its start and end alone miss whatever else ran in between (a run can take an hour)."""

    def __init__(self, every: float = 30.0) -> None:
        self.every, self.samples = every, [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> LoadWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])

    def summary(self) -> dict[str, float]:
        s = self.samples
        return {"mean": round(sum(s) / len(s), 2), "max": round(max(s), 2), "samples": len(s)}
