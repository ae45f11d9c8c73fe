"""The client's view of the server pool: health, in-flight counts and routing.

Routing is one small interface (``RoutingPolicy.pick``) with two policies, ``round_robin`` and
``least_inflight``; rid-stickiness sits on top of either: every segment and turn of one rid goes
to the server that served it first while that server is healthy (a bounded LRU map).

Health is passive plus a probe: a server that fails ``unhealthy_after`` calls in a row leaves
the rotation; the engine's background probe re-admits it (``mark_healthy``) once ``/health``
answers again and its weight version is current. Every method is thread-safe: the pool is shared
by the executor's loop, a caller's own loop, and the weight-update coroutine.
"""

from __future__ import annotations

import abc
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass

logger = logging.getLogger("arealite.rollout.router")


@dataclass
class ServerStatus:
    addr: str
    healthy: bool = True
    consecutive_failures: int = 0
    inflight: int = 0
    served: int = 0  # successful calls, for observability and tests
    last_error: str = ""


class RoutingPolicy(abc.ABC):
    """Choose one server among ``candidates`` (non-empty); ``order`` is the pool's full list."""

    @abc.abstractmethod
    def pick(self, candidates: list[ServerStatus], order: list[str]) -> ServerStatus: ...


class RoundRobin(RoutingPolicy):
    """Next server after the previous pick, in pool order, skipping non-candidates; so requests
    spread evenly and a server that leaves and returns does not get a burst."""

    def __init__(self) -> None:
        self._next = 0

    def pick(self, candidates: list[ServerStatus], order: list[str]) -> ServerStatus:
        n = len(order)
        if len(candidates) == n:  # every server is a candidate (the usual case)
            idx = self._next % n
            self._next = idx + 1
            return candidates[idx]
        by_addr = {c.addr: c for c in candidates}
        for i in range(n):
            idx = (self._next + i) % n
            c = by_addr.get(order[idx])
            if c is not None:
                self._next = idx + 1
                return c
        raise ValueError("candidates must be members of the pool")


class LeastInflight(RoutingPolicy):
    """The server with the fewest requests in flight; ties go round-robin."""

    def __init__(self) -> None:
        self._rr = RoundRobin()

    def pick(self, candidates: list[ServerStatus], order: list[str]) -> ServerStatus:
        least = min(c.inflight for c in candidates)
        return self._rr.pick([c for c in candidates if c.inflight == least], order)


POLICIES: dict[str, type[RoutingPolicy]] = {"round_robin": RoundRobin, "least_inflight": LeastInflight}


class NoHealthyServer(RuntimeError):
    pass


class ServerRouter:
    def __init__(
        self,
        addrs: list[str],
        policy: str = "round_robin",
        sticky: bool = True,
        unhealthy_after: int = 3,
        sticky_capacity: int = 65536,
    ):
        if not addrs:
            raise ValueError("the server pool needs at least one address")
        if len(set(addrs)) != len(addrs):
            raise ValueError(f"duplicate server addresses: {addrs}")
        if policy not in POLICIES:
            raise ValueError(f"unknown schedule_policy {policy!r}; choose from {sorted(POLICIES)}")
        self.addrs = list(addrs)
        self.servers = {a: ServerStatus(a) for a in addrs}
        self.policy = POLICIES[policy]()
        self.sticky = sticky
        self.unhealthy_after = unhealthy_after
        self._sticky_capacity = sticky_capacity
        self._sticky: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()
        # The healthy servers in pool order, rebuilt only when a server's health changes (under
        # the lock) rather than filtered on every ``choose`` (the per-request hot path).
        self._healthy: list[ServerStatus] = list(self.servers.values())

    # ------------------------------------------------------------------ routing

    def choose(
        self, rid: str | None = None, exclude: frozenset[str] | set[str] = frozenset(),
        acquire: bool = False,
    ) -> str:
        """A healthy server for ``rid``: its sticky server when healthy and not excluded, else
        the policy's pick among healthy non-excluded servers (or among all healthy ones when
        every healthy server is excluded). Raises ``NoHealthyServer`` when none is healthy.
        ``acquire`` also counts a call in flight on it (release with ``release``).

        The client's per-request hot path: one lock, no helper calls but the policy's."""
        with self._lock:
            healthy = self._healthy
            if not healthy:
                raise NoHealthyServer("no healthy server in the pool: " + self._describe_locked())
            sticky = self._sticky if self.sticky and rid is not None else None
            addr = sticky.get(rid) if sticky is not None else None
            if addr is not None and self.servers[addr].healthy and addr not in exclude:
                sticky.move_to_end(rid)
            else:
                candidates = [s for s in healthy if s.addr not in exclude] if exclude else healthy
                state = self.policy.pick(candidates or healthy, self.addrs)
                if sticky is not None:
                    known = addr is not None
                    addr = sticky[rid] = state.addr
                    if known:  # a new rid is already the most recent
                        sticky.move_to_end(rid)
                    elif len(sticky) > self._sticky_capacity:
                        sticky.popitem(last=False)
                else:
                    addr = state.addr
            if acquire:
                self.servers[addr].inflight += 1
            return addr

    def sticky_server(self, rid: str) -> str | None:
        with self._lock:
            return self._sticky.get(rid)

    def forget(self, rid: str) -> None:
        """Drop a rid's stickiness (its conversation is over)."""
        with self._lock:
            self._sticky.pop(rid, None)

    # ------------------------------------------------------------------ accounting

    def acquire(self, addr: str) -> None:
        with self._lock:
            self.servers[addr].inflight += 1

    def release(self, addr: str, success: bool = False) -> None:
        """End a call counted by ``acquire``; ``success`` also records it (one lock, hot path)."""
        with self._lock:
            s = self.servers[addr]
            s.inflight -= 1
            if success:
                s.consecutive_failures = 0
                s.served += 1

    def record_success(self, addr: str) -> None:
        with self._lock:
            s = self.servers[addr]
            s.consecutive_failures = 0
            s.served += 1

    def record_failure(self, addr: str, reason: str) -> bool:
        """Count a failed call; returns True when this failure took the server out."""
        with self._lock:
            s = self.servers[addr]
            s.consecutive_failures += 1
            s.last_error = reason
            if s.healthy and s.consecutive_failures >= self.unhealthy_after:
                s.healthy = False
                self._refresh_healthy_locked()
                logger.warning(
                    "server %s marked unhealthy after %d consecutive failures (last: %s)",
                    addr, s.consecutive_failures, reason,
                )
                return True
            return False

    def mark_unhealthy(self, addr: str, reason: str) -> None:
        with self._lock:
            s = self.servers[addr]
            if s.healthy:
                logger.warning("server %s taken out of the pool: %s", addr, reason)
            s.healthy = False
            s.last_error = reason
            self._refresh_healthy_locked()

    def mark_healthy(self, addr: str) -> None:
        with self._lock:
            s = self.servers[addr]
            if not s.healthy:
                logger.info("server %s re-admitted to the pool", addr)
            s.healthy = True
            s.consecutive_failures = 0
            self._refresh_healthy_locked()

    def _refresh_healthy_locked(self) -> None:
        # A new list (never mutated in place): a caller may still hold the previous one.
        self._healthy = [self.servers[a] for a in self.addrs if self.servers[a].healthy]

    # ------------------------------------------------------------------ views

    def healthy_addrs(self) -> list[str]:
        with self._lock:
            return [a for a in self.addrs if self.servers[a].healthy]

    def unhealthy_addrs(self) -> list[str]:
        with self._lock:
            return [a for a in self.addrs if not self.servers[a].healthy]

    def is_healthy(self, addr: str) -> bool:
        with self._lock:
            return self.servers[addr].healthy

    def describe(self) -> str:
        with self._lock:
            return self._describe_locked()

    def _describe_locked(self) -> str:
        parts = []
        for a in self.addrs:
            s = self.servers[a]
            state = "healthy" if s.healthy else f"unhealthy ({s.last_error or 'no reason'})"
            parts.append(f"{a}: {state}")
        return "; ".join(parts)
