"""Routing policies, rid-stickiness (bounded LRU) and health bookkeeping of the pool."""

from __future__ import annotations

from collections import Counter

import pytest

from arealite.rollout.router import NoHealthyServer, ServerRouter

ADDRS = ["h:1", "h:2", "h:3"]


def test_round_robin_spreads_evenly_and_skips_unhealthy():
    pool = ServerRouter(ADDRS, "round_robin", sticky=False)
    assert [pool.choose() for _ in range(6)] == ADDRS * 2
    pool.mark_unhealthy("h:2", "down")
    picks = [pool.choose() for _ in range(6)]
    assert Counter(picks) == {"h:1": 3, "h:3": 3}
    pool.mark_healthy("h:2")
    assert Counter(pool.choose() for _ in range(30)) == {a: 10 for a in ADDRS}


def test_least_inflight():
    pool = ServerRouter(ADDRS, "least_inflight", sticky=False)
    held = [pool.choose() for _ in range(3)]
    for a in held:
        pool.acquire(a)
    assert sorted(held) == ADDRS  # ties go round-robin
    pool.acquire("h:1")
    pool.acquire("h:3")
    assert pool.choose() == "h:2"
    pool.release("h:1")
    pool.release("h:3")
    pool.acquire("h:2")
    assert pool.choose() in {"h:1", "h:3"}


def test_exclude_prefers_untried_servers_then_falls_back():
    pool = ServerRouter(ADDRS, sticky=False)
    for _ in range(5):
        assert pool.choose(exclude={"h:1", "h:2"}) == "h:3"
    pool.mark_unhealthy("h:3", "x")
    assert pool.choose(exclude={"h:1", "h:2"}) in {"h:1", "h:2"}  # all healthy ones tried


def test_sticky_rids_stay_while_healthy_and_move_when_not():
    pool = ServerRouter(ADDRS, "round_robin", sticky=True)
    first = pool.choose("rid-a")
    assert all(pool.choose("rid-a") == first for _ in range(10))
    other = pool.choose("rid-b")
    assert other != first
    pool.mark_unhealthy(first, "down")
    moved = pool.choose("rid-a")
    assert moved != first and pool.sticky_server("rid-a") == moved
    pool.mark_healthy(first)
    assert pool.choose("rid-a") == moved  # stays on its new server
    assert pool.choose("rid-a", exclude={moved}) != moved  # a retry leaves it


def test_sticky_map_is_bounded_lru():
    pool = ServerRouter(ADDRS, sticky=True, sticky_capacity=3)
    for r in ["a", "b", "c"]:
        pool.choose(r)
    pool.choose("a")  # refresh a
    pool.choose("d")  # evicts b, the least recently used
    assert pool.sticky_server("b") is None
    assert pool.sticky_server("a") is not None and pool.sticky_server("d") is not None
    pool.forget("a")
    assert pool.sticky_server("a") is None


def test_failures_take_a_server_out_after_n_in_a_row():
    pool = ServerRouter(ADDRS, unhealthy_after=3)
    assert not pool.record_failure("h:1", "e1")
    assert not pool.record_failure("h:1", "e2")
    pool.record_success("h:1")  # resets the streak
    assert not pool.record_failure("h:1", "e3")
    assert not pool.record_failure("h:1", "e4")
    assert pool.record_failure("h:1", "e5")
    assert pool.unhealthy_addrs() == ["h:1"]
    assert "e5" in pool.describe()
    pool.mark_unhealthy("h:2", "x")
    pool.mark_unhealthy("h:3", "y")
    with pytest.raises(NoHealthyServer, match="h:1: unhealthy"):
        pool.choose("r")


def test_bad_pool_settings():
    with pytest.raises(ValueError, match="at least one"):
        ServerRouter([])
    with pytest.raises(ValueError, match="duplicate"):
        ServerRouter(["a:1", "a:1"])
    with pytest.raises(ValueError, match="schedule_policy"):
        ServerRouter(["a:1"], policy="random")
