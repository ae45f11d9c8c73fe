"""``launcher.colocate_servers: recreate``: the trainer asks the local launcher to stop its
inference servers for the train phase and to start them again for the rollout phase.

Only the launcher owns the server processes, so the request goes to it: the trainer's rank 0
writes ``{"seq": n, "action": "stop" | "start"}`` to ``{run_dir}/server_cycle/request.json``; the
launcher, polling it in its watch loop, stops the servers (every process of each group) or
starts each with its original command on its original port and waits for ``/health``, then
writes ``{"seq": n, "ok": bool, "message": ...}`` to ``ack.json``. Both files are replaced
atomically, so neither side reads half of one. The launcher names the directory to the trainer
in ``AREAL_SERVER_CYCLE_DIR``: a trainer started without it (not under the local launcher)
refuses the option at once rather than waiting for an answer that never comes.

A server started again holds the model it was launched with; the push that follows every
train phase (``weight_update.type: tensor``) gives it the newest weights and version before
generation continues.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

CYCLE_ENV = "AREAL_SERVER_CYCLE_DIR"
ACTIONS = ("stop", "start")


def write_atomic(path: Path, text: str) -> None:
    """Readers polling ``path`` never see half of it."""
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(text)
    os.replace(tmp, path)


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


class ServerCycleError(RuntimeError):
    """The launcher refused, failed or never answered a stop/start request."""


class ServerCycleClient:
    """The trainer's side (rank 0 only)."""

    def __init__(self, directory: str | Path, poll: float = 0.02) -> None:
        self.dir = Path(directory)
        self.poll = poll
        self.seq = (_read(self.dir / "ack.json") or {}).get("seq", 0)  # a restarted trainer

    @classmethod
    def from_env(cls) -> ServerCycleClient:
        d = os.environ.get(CYCLE_ENV)
        if not d:
            raise ServerCycleError(
                "launcher.colocate_servers=recreate needs the local launcher (arealite train) to "
                f"stop and start the servers, and {CYCLE_ENV} is not set: start the run with "
                "`arealite train`, or use launcher.colocate_servers=release")
        return cls(d)

    def request(self, action: str, timeout: float) -> str:
        """Ask for ``action`` and wait for its answer; returns the launcher's message."""
        if action not in ACTIONS:
            raise ValueError(f"action must be one of {ACTIONS}, got {action!r}")
        self.seq += 1
        write_atomic(self.dir / "request.json", json.dumps({"seq": self.seq, "action": action}))
        deadline = time.monotonic() + timeout
        while True:
            ack = _read(self.dir / "ack.json")
            if ack is not None and ack.get("seq") == self.seq:
                if not ack.get("ok"):
                    raise ServerCycleError(f"the launcher could not {action} the servers: "
                                           f"{ack.get('message')}")
                return str(ack.get("message", ""))
            if time.monotonic() >= deadline:
                raise ServerCycleError(f"the launcher did not {action} the servers within "
                                       f"{timeout:.0f} s")
            time.sleep(self.poll)


class ServerCycleHost:
    """The launcher's side: ``pending()`` in its watch loop, ``answer()`` when done."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        for name in ("request.json", "ack.json"):  # never an earlier run's
            (self.dir / name).unlink(missing_ok=True)
        self.done = 0

    def pending(self) -> tuple[int, str] | None:
        """``(seq, action)`` of a request not answered yet."""
        req = _read(self.dir / "request.json")
        if req is None or not isinstance(req.get("seq"), int) or req["seq"] <= self.done:
            return None
        return req["seq"], str(req.get("action"))

    def answer(self, seq: int, ok: bool, message: str) -> None:
        self.done = seq
        write_atomic(self.dir / "ack.json", json.dumps({"seq": seq, "ok": ok, "message": message}))
