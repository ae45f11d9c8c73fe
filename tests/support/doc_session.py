"""A doc's server commands run as a reader runs them: one shell per doc, its commands in order
(later lines read what earlier ones set: ``ADDRS=``, ``G=``), the docs' placeholders replaced by
values the test computes (free ports, the pool's addresses, a checkpoint), in a folder of its
own, killed by process group afterwards. A command that fails stops the shell (``set -e``), and
so does a ``curl`` whose answer is an HTTP error: what a reader would see as a failure."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.doc_commands import Command

# every curl of a session fails on an HTTP error (curl -s alone exits 0 on a 400); one that
# already says -f (which curl refuses beside --fail-with-body) is left as written
PRELUDE = """set -e
curl() {
  local a
  for a in "$@"; do case $a in -[!-]*f*) command curl "$@"; return;; esac; done
  command curl --fail-with-body "$@"
}
"""
# a server the doc starts in the foreground (a reader runs it in a second terminal and watches it
# come up): run in the background, then waited for on its own /health
FOREGROUND_SERVER = re.compile(r"^\S*python -m servers\.(gateway|launch_server) .*--port (\d+)$")


@dataclass
class Session:
    """One doc's shell, started in a process group of its own."""

    cwd: Path
    name: str
    groups: list[int] = field(default_factory=list)

    def script(self, cmds: list[Command], values: dict[str, str]) -> str:
        lines = [PRELUDE]
        for cmd in cmds:
            text = cmd.text
            for k, v in values.items():
                text = text.replace(k, v)
            lines.append(f'echo ">>> {cmd.doc}:{cmd.line} at $EPOCHREALTIME"')
            if m := FOREGROUND_SERVER.match(text):
                log = f"{self.name}_{m.group(1)}.log"
                lines.append(f"{text} > {log} 2>&1 &")
                lines.append(
                    f"until command curl -sf http://127.0.0.1:{m.group(2)}/health "
                    f"> /dev/null; do sleep 0.5; done"
                )
            else:
                lines.append(text)
        return "\n".join(lines) + "\n"

    def run(self, cmds: list[Command], values: dict[str, str], timeout: float) -> tuple[int, str]:
        """Runs the doc's commands; (exit status, output). The shell's background servers stay
        up (a later doc may talk to them) until ``stop``."""
        script = self.cwd / f"{self.name}.sh"
        script.write_text(self.script(cmds, values))
        out_path = self.cwd / f"{self.name}.out"
        with open(out_path, "w") as out:
            # output to a file: a background server keeps the shell's stdout open after it exits
            proc = subprocess.Popen(
                ["bash", str(script)],
                cwd=self.cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.groups.append(proc.pid)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = 124
        return code, out_path.read_text()

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM every group this session started (the pool stops its servers on it), then
        SIGKILL what is left after ``grace`` seconds."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for g in self.groups:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(g, sig)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and any(_alive(g) for g in self.groups):
                time.sleep(0.2)


def _alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
