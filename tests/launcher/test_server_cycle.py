"""The trainer <-> launcher channel of ``launcher.colocate_servers=recreate``: a request is
answered once, a refusal and a silence are errors that say so, a trainer outside the launcher
refuses the option at once."""

from __future__ import annotations

import threading
import time

import pytest

from arealite.launcher.server_cycle import (
    CYCLE_ENV,
    ServerCycleClient,
    ServerCycleError,
    ServerCycleHost,
)


def serve(host: ServerCycleHost, answers: list[tuple[bool, str]]) -> threading.Thread:
    """A launcher loop that answers the next len(answers) requests in order."""
    def run() -> None:
        for ok, msg in answers:
            while (req := host.pending()) is None:
                time.sleep(0.005)
            host.answer(req[0], ok, f"{req[1]}: {msg}")
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_requests_are_answered_in_turn_and_refusals_raise(tmp_path):
    host = ServerCycleHost(tmp_path / "cycle")
    t = serve(host, [(True, "1 server(s) stopped"), (False, "a server did not come back")])
    client = ServerCycleClient(host.dir)
    assert client.request("stop", timeout=30) == "stop: 1 server(s) stopped"
    with pytest.raises(ServerCycleError, match="could not start the servers: start: a server"):
        client.request("start", timeout=30)
    t.join(5)
    assert host.pending() is None  # answered requests are not served twice
    # a trainer restarted in the same run goes on from the last answered request
    assert ServerCycleClient(host.dir).seq == 2
    with pytest.raises(ServerCycleError, match="did not stop the servers within"):
        client.request("stop", timeout=0.1)
    with pytest.raises(ValueError, match="action"):
        client.request("pause", timeout=1)


def test_a_trainer_outside_the_launcher_refuses_at_once(monkeypatch):
    monkeypatch.delenv(CYCLE_ENV, raising=False)
    with pytest.raises(ServerCycleError, match="needs the local launcher"):
        ServerCycleClient.from_env()
