"""/health counts only servers that answered their last probe (#37: it reported 2/2 healthy for
addresses where nothing listened, until its third failed probe 15 s later)."""

from __future__ import annotations

import asyncio

import aiohttp

from arealite.utils.network import find_free_port
from servers.gateway.workers import Gateway


def test_unprobed_and_unanswering_servers_are_not_counted():
    async def main() -> tuple[int, int, int]:
        gw = Gateway([f"127.0.0.1:{find_free_port()}"])  # nothing listens there
        before = gw.answering()
        async with aiohttp.ClientSession() as gw.session:
            await gw.check(next(iter(gw.workers.values())))
        gw.probed_once = True
        # routing still tries it (one miss of failure_threshold), /health does not count it
        return before, len(gw.healthy()), gw.answering()

    assert asyncio.run(main()) == (0, 1, 0)
