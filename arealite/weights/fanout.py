"""Moving every server of the pool to new weights (protocol sections 4-6).

Order: the transport's ``prepare`` (before anything is paused) -> ``/pause_generation`` on all
servers at once -> ``/begin_weight_update`` (404 = older server without sessions, tolerated) ->
the transport's ``transfer`` (disk reload calls, the broadcast's buckets, the trainer's
by-reference pushes, vLLM's native transfer) -> ``/end_weight_update``
(404 tolerated) -> ``/continue_generation``. Every call is time-boxed. A server that fails a step is
dropped from the rest of the sequence and reported; ``continue_generation`` is sent to every
server that was paused, whatever happened, so no server is left paused. The paths and bodies
of pause, resume and the disk reload are the backend's (``GenerateProtocol``: SGLang's above,
vLLM's ``/pause``, ``/collective_rpc`` reload and ``/resume``).

The broadcast transport's group lives here, kept across updates (``prepare_group``,
``broadcast_buckets``, ``destroy_group``). Its layout: the trainer is rank 0; server k joins at
``rank_offset = 1 + Σ_{j<k} tp_size_j`` and ``world_size = 1 + Σ tp_size`` (tp sizes from
``/server_info``). The client publishes ``meta.world_size`` before pausing anything (the trainer waits for it);
the group backend is ``meta.backend`` when set, else ``nccl`` when every server runs on CUDA and
``gloo`` otherwise (``/server_info`` ``device``), written back to ``meta.backend``.

This module sits below the transports: they call its fan-out and its group, and ``run`` is handed
the transport (``TransferSteps``: the two hooks it calls) by the caller, who picks it from the
table (``arealite.weights.table.transport_for``). Neither this module nor the transports know
the table, so the table can import every transport.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

from arealite.api.io_struct import WeightUpdateError, WeightUpdateMeta, WeightUpdateReport
from arealite.backends.base import GenerateProtocol
from arealite.backends.sglang import SGLANG
from arealite.utils.http import HTTPStatusError, call_json, describe_error
from arealite.utils.keys import HINT

logger = logging.getLogger("arealite.weights.fanout")


# SGLang's answer to /begin_weight_update while a session is open (our servers give the same)
STALE_SESSION = "a weight-update session is already open"


class TransferSteps(Protocol):
    """What ``WeightSync.run`` calls of a transport's client half
    (``arealite.weights.transport.WeightTransport`` has both)."""

    async def prepare(self, sync: WeightSync, session: aiohttp.ClientSession, addrs: list[str],
                      meta: WeightUpdateMeta, timeout: float, failed: dict[str, str]) -> list[str]:
        ...

    async def transfer(self, sync: WeightSync, session: aiohttp.ClientSession,
                       alive: list[str], meta: WeightUpdateMeta, failed: dict[str, str],
                       timeout: float) -> list[str]:
        ...


@dataclass
class GroupLayout:
    world_size: int
    rank_offsets: dict[str, int]
    backend: str


async def get_info(
    session: aiohttp.ClientSession, addr: str, name: str, timeout: float
) -> dict[str, Any]:
    """``/server_info`` or ``/model_info``, falling back to the older ``/get_*`` spelling."""
    last: BaseException | None = None
    for path in (f"/{name}", f"/get_{name}"):
        try:
            res = await call_json(session, "GET", f"http://{addr}{path}", timeout=timeout)
            if isinstance(res.body, dict):
                return res.body
        except Exception as e:  # noqa: BLE001 - try the other spelling, then report
            last = e
    raise WeightUpdateError(f"{addr}: no /{name}: {describe_error(last) if last else 'not a dict'}")


async def group_layout(
    session: aiohttp.ClientSession, addrs: list[str], timeout: float, backend: str | None = None
) -> GroupLayout:
    infos = await asyncio.gather(*(get_info(session, a, "server_info", timeout) for a in addrs))
    return layout_of(addrs, infos, backend)


def layout_of(addrs: list[str], infos: list[dict[str, Any]], backend: str | None) -> GroupLayout:
    offsets, nxt = {}, 1
    for a, info in zip(addrs, infos):
        offsets[a] = nxt
        nxt += int(info.get("tp_size") or 1)
    if backend is None:
        devices = {str(info.get("device") or "cpu") for info in infos}
        backend = "nccl" if devices == {"cuda"} else "gloo"
    return GroupLayout(world_size=nxt, rank_offsets=offsets, backend=backend)


def admin_reason(e: BaseException) -> str:
    """``describe_error``, plus what to set when a server refused the admin key."""
    if isinstance(e, HTTPStatusError) and e.status == 401:
        return f"{describe_error(e)} ({HINT['admin']})"
    return describe_error(e)


class WeightSync:
    """Runs one weight update at a time over a given list of servers."""

    def __init__(self, pause_mode: str, step_timeout: float, poll_interval: float = 0.1,
                 admin_headers: dict[str, str] | None = None,
                 protocol: GenerateProtocol = SGLANG):
        self.pause_mode = pause_mode
        self.protocol = protocol
        # every call here is an admin call (pause, weights, groups): the admin key's header
        self.admin_headers = admin_headers or {}
        self.step_timeout = step_timeout
        self.poll_interval = poll_interval
        self.group: tuple[str, int, str] | None = None  # (master_address, port, group_name)
        self.layout: GroupLayout | None = None
        # The name the current group has on the wire: meta.group_name for the first group
        # this client builds, "-1", "-2", ... appended for rebuilds (after a member died), so
        # that no store key or server-side name of an abandoned group is ever reused.
        self.wire_name: str | None = None
        self._groups_built = 0
        self._key: tuple[str, int, str] | None = None  # the group the current update wants
        # the backend's own transfer API in place of SGLang's group calls (vLLM's), or None
        native = getattr(protocol, "native_transfer", None)
        self.native = native() if native else None

    async def fan_out(
        self,
        session: aiohttp.ClientSession,
        addrs: Iterable[str],
        path: str,
        payload: dict[str, Any] | None,
        failed: dict[str, str],
        timeout: float,
        tolerate_404: bool = False,
    ) -> list[str]:
        """POST to every server at once; returns those that succeeded, records the others."""
        addrs = list(addrs)
        reasons = await asyncio.gather(
            *(self._post(session, a, path, payload, timeout, tolerate_404, self.admin_headers)
              for a in addrs))
        ok = []
        for a, r in zip(addrs, reasons):
            if r is None:
                ok.append(a)
            else:
                failed.setdefault(a, r)
                logger.error("weight update: %s failed %s", a, r)
        return ok

    @staticmethod
    async def _post(session: aiohttp.ClientSession, addr: str, path: str,
                    payload: dict[str, Any] | None, timeout: float, tolerate_404: bool = False,
                    headers: dict[str, str] | None = None) -> str | None:
        """One call; None on success, else the reason."""
        try:
            await call_json(session, "POST", f"http://{addr}{path}", payload, timeout,
                            ok_statuses=(404,) if tolerate_404 else (), headers=headers)
            return None
        except Exception as e:  # noqa: BLE001 - transport, status or body: all reported
            return f"{path}: {admin_reason(e)}"

    async def wait_disk_ready(self, meta: WeightUpdateMeta, timeout: float) -> None:
        """Wait for the trainer's marker ``{"version": v}`` beside the saved HF files."""
        marker = meta.disk_ready_marker
        deadline = time.monotonic() + timeout
        last = "missing"
        while True:
            if meta.abort_reason:  # the trainer failed to save: no marker will come
                raise WeightUpdateError(f"disk update to version {meta.version}: "
                                        f"{meta.abort_reason}")
            try:
                got = meta.read_disk_marker()
                if got == meta.version:
                    return
                last = f"it holds version {got}"
            except FileNotFoundError:
                last = "missing"
            except (ValueError, OSError, AttributeError) as e:  # partially written: retry
                last = f"unreadable ({e})"
            if time.monotonic() >= deadline:
                raise WeightUpdateError(
                    f"disk update to version {meta.version}: marker {marker} {last} after "
                    f"{timeout:.0f} s (the trainer writes it after saving {meta.path})"
                )
            await asyncio.sleep(self.poll_interval)

    async def run(
        self, session: aiohttp.ClientSession, addrs: list[str], meta: WeightUpdateMeta,
        on_pause: Callable[[bool], None] | None = None, *, transport: TransferSteps,
    ) -> WeightUpdateReport:
        """The whole sequence, with ``transport``'s client half (the one ``meta`` names:
        ``arealite.weights.table.transport_for``) checking before the pause and transferring
        between begin and end; returns which servers now hold ``meta.version``. Raises
        ``WeightUpdateError`` (with ``.report``) when no server was updated or a distributed
        transfer broke. ``on_pause(True)`` is called just before ``/pause_generation`` and
        ``on_pause(False)`` after ``/continue_generation``."""
        timeout = min(self.step_timeout, meta.timeout)
        t0 = time.monotonic()
        report = WeightUpdateReport(version=meta.version)
        failed = report.failed
        proto = self.protocol
        try:
            addrs = await transport.prepare(self, session, addrs, meta, timeout, failed)
            if on_pause is not None:
                on_pause(True)
            paused: list[str] = []
            begun: list[str] = []
            try:
                path, body = proto.pause_call(self.pause_mode)
                paused = await self.fan_out(session, addrs, path, body, failed, timeout)
                alive = await self._transfer(session, paused, meta, failed, timeout, begun,
                                             transport)
            finally:
                ended = begun
                if proto.update_session_paths:
                    ended = await self.fan_out(session, begun, proto.update_session_paths[1], {},
                                               failed, timeout, tolerate_404=True)
                # every paused server resumes, failed ones too: nothing may stay paused
                await self.fan_out(session, paused, proto.continue_path, {}, {}, timeout)
                if on_pause is not None:
                    on_pause(False)
            report.updated = [a for a in alive if a in ended and a not in failed]
            if not report.updated:
                raise WeightUpdateError(
                    f"weight update to version {meta.version} failed on every server: "
                    + "; ".join(f"{a}: {r}" for a, r in failed.items())
                )
        except WeightUpdateError as e:
            e.report = report
            meta.abort_reason = meta.abort_reason or str(e)
            raise
        except BaseException as e:
            # the trainer may be waiting for this update's group: tell it to stop waiting
            meta.abort_reason = meta.abort_reason or f"{type(e).__name__}: {e}"
            raise
        finally:
            report.seconds = time.monotonic() - t0
        return report

    async def _transfer(self, session, paused, meta, failed, timeout, begun, transport):
        alive = paused
        if self.protocol.update_session_paths:
            alive = await self._begin(session, paused, failed, timeout)
        begun.extend(alive)
        return await transport.transfer(self, session, alive, meta, failed, timeout)

    async def _begin(self, session, addrs, failed, timeout) -> list[str]:
        """``/begin_weight_update`` on every server. A server that still holds a session was
        left inside an update by a trainer that died there (SIGKILL mid-push; this client is
        the only one that updates these servers): that session is ended (its staged tensors
        dropped, the old weights serving) and a new one begun, instead of failing every update
        of every restarted trainer until the servers are restarted."""
        begin, end = self.protocol.update_session_paths
        first: dict[str, str] = {}
        alive = await self.fan_out(session, addrs, begin, {}, first, timeout, tolerate_404=True)
        stale = [a for a, r in first.items() if STALE_SESSION in r]
        for a, r in first.items():
            if a not in stale:
                failed.setdefault(a, r)
        if stale:
            logger.warning("weight update: %s still held the session of an update that never "
                           "ended (its trainer died inside it); ending it first", stale)
            closed = await self.fan_out(session, stale, end, {}, failed, timeout, tolerate_404=True)
            alive += await self.fan_out(session, closed, begin, {}, failed, timeout,
                                        tolerate_404=True)
        return alive

    def disk_calls(self, meta: WeightUpdateMeta, abort_all: bool = False) -> list:
        """The backend's reload of ``meta.path``; a model it cannot reload in place raises
        ``WeightUpdateError`` with the backend's reason."""
        try:
            # SGLang cannot flush while requests sit in the batch (in_place pause)
            return self.protocol.disk_update_calls(
                str(meta.path), meta.version, self.pause_mode != "in_place", abort_all)
        except ValueError as e:
            raise WeightUpdateError(str(e)) from None

    async def prepare_group(
        self, session: aiohttp.ClientSession, addrs: list[str], meta: WeightUpdateMeta,
        timeout: float, failed: dict[str, str] | None = None,
    ) -> list[str]:
        """Check a distributed meta and publish ``meta.group_name`` (the wire name), the
        backend and, last, ``meta.world_size`` before anything is paused: the trainer waits for
        ``world_size`` to join the group as rank 0. Returns the servers that take part: those
        answering ``/server_info`` (the others go to ``failed``). When the members changed (a
        server died) the old group is abandoned and a new one is built over the survivors."""
        if not meta.param_specs:
            raise WeightUpdateError("a distributed weight update needs meta.param_specs")
        if meta.master_port is None:
            raise WeightUpdateError("a distributed weight update needs meta.master_port")
        failed = {} if failed is None else failed
        infos = await asyncio.gather(
            *(get_info(session, a, "server_info", timeout) for a in addrs), return_exceptions=True)
        live = [(a, i) for a, i in zip(addrs, infos) if not isinstance(i, BaseException)]
        for a, i in zip(addrs, infos):
            if isinstance(i, BaseException):
                failed.setdefault(a, f"/server_info: {describe_error(i)}")
                logger.error("weight update: %s does not answer /server_info: %s", a, describe_error(i))
        if not live:
            raise WeightUpdateError("no server answers /server_info: "
                                    + "; ".join(f"{a}: {r}" for a, r in failed.items()))
        members = [a for a, _ in live]
        key = (meta.master_address, int(meta.master_port), meta.group_name)
        before = None if self.layout is None else sorted(self.layout.rank_offsets)
        if self.group is not None and (self.group != key or set(members) != set(before)):
            # The old group cannot broadcast any more: free it where it still lives.
            await self.destroy_group(session, members)
        if self.group is None:
            # Said whether the old group was freed here or dropped by a failed broadcast.
            if before is not None:
                logger.warning("weight-update group %s: members %s -> %s; building a new group",
                               self.wire_name, before, members)
            self.layout = layout_of(members, [i for _, i in live], meta.backend)
            n = self._groups_built
            self.wire_name = meta.group_name if n == 0 else f"{meta.group_name}-{n}"
        if meta.world_size is not None and meta.world_size != self.layout.world_size:
            raise WeightUpdateError(
                f"meta.world_size={meta.world_size} but the servers need "
                f"{self.layout.world_size} (1 + sum of tp_size)"
            )
        self._key = key
        meta.group_name = self.wire_name
        if meta.backend is None:
            meta.backend = self.layout.backend
        # Last: a trainer polling for world_size then finds the name and backend already set.
        meta.world_size = self.layout.world_size
        return members

    async def broadcast_buckets(self, session: aiohttp.ClientSession, alive: list[str],
                                meta: WeightUpdateMeta, failed: dict[str, str],
                                timeout: float) -> list[str]:
        """The broadcast transport's receive: join the group (first update, or after a
        rebuild), then every bucket on every member at once while the trainer sends it."""
        lay = self.layout
        if set(alive) != set(lay.rank_offsets):
            self.group = None
            raise WeightUpdateError(
                "servers dropped out before the broadcast: "
                + "; ".join(f"{a}: {r}" for a, r in failed.items())
            )
        if self.group != self._key:

            async def init(a: str) -> str | None:
                payload = {
                    "master_address": meta.master_address, "master_port": int(meta.master_port),
                    "rank_offset": lay.rank_offsets[a], "world_size": lay.world_size,
                    "group_name": meta.group_name, "backend": meta.backend or lay.backend,
                }
                reason = await self._post(session, a, "/init_weights_update_group", payload,
                                          timeout, headers=self.admin_headers)
                if reason is None:
                    return a
                # A server still holding a group of that name (its trainer died and a restarted
                # one builds the group again) refuses the name: free it, then try once more.
                if await self._destroy_quietly(session, a, meta.group_name, timeout):
                    ok = await self.fan_out(
                        session, [a], "/init_weights_update_group", payload, failed, timeout)
                    return a if ok else None
                failed.setdefault(a, reason)
                logger.error("weight update: %s failed %s", a, reason)
                return None

            if not await self._all_join(alive, init):
                # The members that did join wait in a rendezvous that will never complete
                # (as does the trainer, until it sees meta.abort_reason): never reuse the name.
                self._groups_built += 1
                msg = "init_weights_update_group failed: " + "; ".join(
                    f"{a}: {r}" for a, r in failed.items())
                meta.abort_reason = msg
                raise WeightUpdateError(msg)
            self.group = self._key
            self._groups_built += 1
        n = len(meta.param_specs)
        for i, bucket in enumerate(meta.param_specs):
            last = i == n - 1
            payload = {
                "names": [p.name for p in bucket],
                "dtypes": [str(p.dtype).removeprefix("torch.") for p in bucket],
                "shapes": [list(p.shape) for p in bucket],
                "group_name": meta.group_name,
                "flush_cache": last and self.pause_mode != "in_place",
                "abort_all_requests": False,
                "weight_version": str(meta.version) if last else None,
                "load_format": "flattened_bucket",
            }
            members = alive
            alive = await self.fan_out(
                session, members, "/update_weights_from_distributed", payload, failed, timeout
            )
            if len(alive) != len(members):
                # a collective with a missing member cannot go on; the group is unusable
                self.group = None
                msg = f"bucket {i + 1}/{n} failed: " + "; ".join(
                    f"{a}: {r}" for a, r in failed.items())
                await self._spare_the_living(session, [a for a in members if a not in alive],
                                             failed)
                raise WeightUpdateError(msg)
        return alive

    async def _spare_the_living(
        self, session: aiohttp.ClientSession, lost: list[str], failed: dict[str, str]
    ) -> None:
        """When one member of a broadcast dies, the others' receives fail with it. Those that
        still answer are not at fault: take them off ``failed`` so they stay in the pool (with
        part of the new weights, until the trainer's retry sends all of them again)."""
        infos = await asyncio.gather(
            *(get_info(session, a, "server_info", 5.0) for a in lost), return_exceptions=True)
        for a, info in zip(lost, infos):
            if not isinstance(info, BaseException):
                logger.warning("weight update: %s lost its broadcast group (%s) but is alive; "
                               "it stays in the pool for the retry", a, failed.pop(a, ""))

    @staticmethod
    async def _all_join(addrs: list[str], init: Callable[[str], Any]) -> bool:
        """Run ``init`` on every server at once; False as soon as one fails. The others'
        calls are then cancelled: they block until every rank joined, which a failed member
        never does, so waiting for them would only wait out the servers' group timeout."""
        tasks = [asyncio.ensure_future(init(a)) for a in addrs]
        try:
            for fut in asyncio.as_completed(tasks):
                if await fut is None:
                    return False
            return True
        finally:
            for t in tasks:
                t.cancel()

    async def destroy_group(self, session: aiohttp.ClientSession, addrs: list[str]) -> None:
        if self.group is None:
            return
        if self.native is not None:
            await self.native.shutdown(self, session, addrs)
            return
        await self.fan_out(
            session, addrs, "/destroy_weights_update_group", {"group_name": self.wire_name},
            {}, min(10.0, self.step_timeout),
        )
        self.group = None

    async def _destroy_quietly(
        self, session: aiohttp.ClientSession, addr: str, name: str, timeout: float
    ) -> bool:
        """Destroy group ``name`` on ``addr``; True when it existed and is gone."""
        try:
            await call_json(session, "POST", f"http://{addr}/destroy_weights_update_group",
                            {"group_name": name}, min(10.0, timeout), headers=self.admin_headers)
        except Exception as e:  # noqa: BLE001 - e.g. 400 "does not exist": nothing to free
            logger.debug("destroy %s on %s: %s", name, addr, describe_error(e))
            return False
        logger.warning("freed a leftover weight-update group %r on %s", name, addr)
        return True
