"""The client half's seam (``arealite.weights.transport``): a transport's ``prepare`` runs before
anything is paused, its ``transfer`` inside the update session, and the shared sequence around
them (``WeightSync.run``) resumes every paused server and reports failures whatever the
transport did."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from arealite.api.io_struct import WeightUpdateError, WeightUpdateMeta
from arealite.weights.fanout import WeightSync
from arealite.weights.transport import WeightTransport
from tests.support.scripted_sglang import ScriptedServer


class Recording(WeightTransport):
    """A transport that records where in the sequence its halves run."""

    name = "recording"

    def __init__(self, servers: list[ScriptedServer], fail_on: str | None = None):
        self.servers, self.fail_on, self.seen = servers, fail_on, {}

    async def prepare(self, sync, session, addrs, meta, timeout, failed):
        self.seen["prepare"] = [list(s.paths()) for s in self.servers]
        failed[addrs[-1]] = "refused in prepare"
        return addrs[:-1]  # the last server takes no part

    async def transfer(self, sync, session, alive, meta, failed, timeout):
        self.seen["transfer"] = [list(s.paths()) for s in self.servers]
        if self.fail_on == "transfer":
            raise WeightUpdateError("the wire broke")
        return alive


@pytest.fixture
def servers():
    made = [ScriptedServer().start() for _ in range(3)]
    yield made
    for s in made:
        s.close()


def run(ws: WeightSync, addrs: list[str], t: WeightTransport):
    async def go():
        async with aiohttp.ClientSession() as session:
            return await ws.run(session, addrs, WeightUpdateMeta.tensor(1), transport=t)

    return asyncio.run(go())


def test_prepare_before_the_pause_transfer_inside_the_session(servers):
    t = Recording(servers)
    report = run(WeightSync("abort", 10), [s.addr for s in servers], t)
    assert t.seen["prepare"] == [[], [], []]  # nothing paused yet
    assert t.seen["transfer"][:2] == [["/pause_generation", "/begin_weight_update"]] * 2
    assert t.seen["transfer"][2] == []  # dropped in prepare: never paused
    for s in servers[:2]:
        assert s.paths() == ["/pause_generation", "/begin_weight_update", "/end_weight_update",
                             "/continue_generation"]
    assert report.updated == [s.addr for s in servers[:2]]
    assert report.failed == {servers[2].addr: "refused in prepare"}


def test_a_failed_transfer_still_resumes_every_paused_server(servers):
    t = Recording(servers, fail_on="transfer")
    with pytest.raises(WeightUpdateError, match="the wire broke") as ei:
        run(WeightSync("abort", 10), [s.addr for s in servers], t)
    assert ei.value.report is not None and ei.value.report.updated == []
    for s in servers[:2]:
        assert s.paths()[-1] == "/continue_generation"
