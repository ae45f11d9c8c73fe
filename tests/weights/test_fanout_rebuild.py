"""The distributed weight-update group after failures: a restarted trainer frees the group its
dead predecessor left on a server; a dead member makes the group be rebuilt, under a new name,
over the survivors (so updates keep succeeding on them)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from arealite.api.io_struct import ParamSpec, WeightUpdateError, WeightUpdateMeta
from arealite.weights.fanout import WeightSync
from arealite.weights.table import transport_for
from tests.support.scripted_sglang import ScriptedServer

SPECS = [[ParamSpec("w", (2,), "float32")]]


@pytest.fixture
def servers():
    made: list[ScriptedServer] = []

    def factory(n: int) -> list[ScriptedServer]:
        new = [ScriptedServer().start() for _ in range(n)]
        made.extend(new)
        return new

    yield factory
    for s in made:
        s.close()


def meta(version: int) -> WeightUpdateMeta:
    return WeightUpdateMeta("distributed", version, master_port=23456, param_specs=SPECS)


def update(ws: WeightSync, addrs: list[str], m: WeightUpdateMeta):
    async def go():
        async with aiohttp.ClientSession() as session:
            return await ws.run(session, addrs, m, transport=transport_for(m))

    return asyncio.run(go())


def leftover_group(existed: bool):
    """A server whose group name is taken until it is destroyed."""
    state = {"taken": True}

    def init(body):
        if state["taken"]:
            return 400, {"success": False, "message": "Failed to initialize custom process group: "
                         "The specified group name has already been created."}
        return 200, {"success": True, "message": "ok"}

    def destroy(body):
        if not existed:
            return 400, {"success": False, "message": "The group to be destroyed does not exist."}
        state["taken"] = False
        return 200, {"success": True, "message": "ok"}

    return init, destroy


def test_a_leftover_group_is_freed_and_the_init_retried(servers):
    (a,) = servers(1)
    a.on_control["/init_weights_update_group"], a.on_control["/destroy_weights_update_group"] = leftover_group(True)
    report = update(WeightSync("abort", 10), [a.addr], meta(1))
    assert report.updated == [a.addr] and not report.failed and a.version == "1"
    assert [p for p in a.paths() if "group" in p] == [
        "/init_weights_update_group", "/destroy_weights_update_group", "/init_weights_update_group"]
    assert a.bodies("/destroy_weights_update_group") == [{"group_name": "weight_update_group"}]


def test_an_init_failure_without_a_leftover_group_is_not_retried(servers):
    (a,) = servers(1)
    a.on_control["/init_weights_update_group"], a.on_control["/destroy_weights_update_group"] = leftover_group(False)
    with pytest.raises(WeightUpdateError, match="already been created") as e:
        update(WeightSync("abort", 10), [a.addr], meta(1))
    assert list(e.value.report.failed) == [a.addr]
    assert len(a.bodies("/init_weights_update_group")) == 1
    assert a.paths()[-1] == "/continue_generation"  # nothing left paused


def test_a_dead_member_makes_a_new_group_over_the_survivors(servers):
    a, b = servers(2)
    ws = WeightSync("abort", 10)
    m1 = meta(1)
    assert update(ws, [a.addr, b.addr], m1).updated == [a.addr, b.addr]
    assert (m1.group_name, m1.world_size) == ("weight_update_group", 3)
    update(ws, [a.addr, b.addr], meta(2))  # same members: the group is kept
    assert len(a.bodies("/init_weights_update_group")) == 1

    b.stop()  # killed: the pool may not know yet
    m3 = meta(3)
    report = update(ws, [a.addr, b.addr], m3)
    assert report.updated == [a.addr] and list(report.failed) == [b.addr]
    assert "/server_info" in report.failed[b.addr]
    # The trainer reads the new name and world size from the meta the client published.
    assert (m3.group_name, m3.world_size) == ("weight_update_group-1", 2)
    assert a.bodies("/destroy_weights_update_group") == [{"group_name": "weight_update_group"}]
    init = a.bodies("/init_weights_update_group")[-1]
    assert (init["group_name"], init["world_size"], init["rank_offset"]) == ("weight_update_group-1", 2, 1)
    assert a.bodies("/update_weights_from_distributed")[-1]["group_name"] == "weight_update_group-1"
    assert a.version == "3"

    m4 = meta(4)
    assert update(ws, [a.addr], m4).updated == [a.addr]  # the new group is kept
    assert m4.group_name == "weight_update_group-1" and len(a.bodies("/init_weights_update_group")) == 2
