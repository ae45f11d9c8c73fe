"""``RemoteInferenceEngine``: the client of a pool of SGLang-protocol servers (real SGLang or our
embedded ones): generation, routing, failover and health. Its base class, ``RolloutControl``,
owns the rollout executor.

- ``agenerate`` posts ``/generate`` with ``input_ids`` and ``return_logprob``; an aborted
  segment (a pause for a weight update) is resumed with prompt + tokens so far and the remaining
  ``max_new_tokens`` once the engine is no longer paused, each segment's tokens, logprobs and
  versions appended exactly once, each under its own server-side rid ``<rid>-<n>`` (routing
  stays sticky on the caller's rid).
- Failures: connection errors, timeouts (``request_timeout`` per attempt) and 5xx/408/429 are
  retried, with backoff, on another healthy server (``request_retries`` times); a 4xx is not
  retried and surfaces the server's message. A server failing ``unhealthy_after_failures``
  calls in a row leaves the rotation until the background probe sees it healthy again.
- Versions: per output token, from the server's ``weight_versions`` spans (else its
  ``weight_version``; a non-integer one, SGLang's launch default ``"default"``, reads as the
  engine's version when the request started). LoRA runs: the version of the adapter the segment
  was sent with (``arealite.weights.adapters``).
- Bodies and answers belong to the backend's ``GenerateProtocol`` (``arealite.backends``; with
  ``image_data`` for a request's images): another backend is another protocol, not another client.
- The trainer's half (submit, wait, batches, pause, versions, recovery state) is
  ``RolloutControl``'s, the base class, which owns the event-loop thread (lent to the executor,
  and running this client's requests, updates and probes) and the version clock (``self.clock``,
  shared with the staleness gate and other engines of the same trainer rank).
- An observer (``set_observer``: the trace) is told of each request, each attempt of it on a
  server and each weight push, and the executor of each episode; unobserved, nothing is called.
- ``update_weights`` runs the client half of the update's transport (``arealite.weights.table``)
  over the pool on the engine's loop, returning a ``Future``; the version moves once every
  remaining server confirmed. A server that
  fails an update leaves the pool until its version is current (re-synced from disk if need be).
- ``ModelResponse.ttft``: time until the first segment with tokens returned (an upper bound).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import time
from concurrent.futures import Future
from typing import Any

import aiohttp
import torch

from arealite.api.config.rollout import InferenceEngineConfig
from arealite.api.io_struct import (
    ModelRequest,
    ModelResponse,
    VersionClock,
    WeightUpdateError,
    WeightUpdateMeta,
)
from arealite.api.trajectory import RoutedExpertsError
from arealite.backends.base import GenerateProtocol, ProtocolError
from arealite.backends.sglang import SGLANG
from arealite.observe.rollout_observer import RolloutObserver
from arealite.rollout.group_generate import generate_group
from arealite.rollout.health import ready_for_readmission, wait_healthy
from arealite.rollout.rollout_control import RolloutControl
from arealite.rollout.routed_experts import check_complete, join_segment
from arealite.rollout.router import NoHealthyServer, ServerRouter
from arealite.utils.http import (
    RETRYABLE_STATUS,
    TRANSPORT_ERRORS,
    SessionCache,
    decode_body,
    describe_error,
    error_message,
    uncancel,
)
from arealite.utils.keys import HINT, ClientKeys
from arealite.utils.network import parse_addrs
from arealite.weights.adapter_versions import AdapterVersions
from arealite.weights.fanout import GroupLayout, WeightSync, group_layout
from arealite.weights.table import transport_for
from arealite.weights.transport import PoolSide
from arealite.weights.verify import WeightVerifier
from arealite.weights.verify_by_name import fetch_weights, weight_mismatches

logger = logging.getLogger("arealite.rollout.remote_engine")

# Consecutive aborts without a token, while the engine is not paused, before a request fails
# (with backoff up to 1 s each: over a minute of a server refusing to start it).
MAX_EMPTY_ABORTS = 100

ADDRS_ENV = "AREAL_LLM_SERVER_ADDRS"
_NO_SERVERS: frozenset[str] = frozenset()


class GenerationError(RuntimeError):
    """A request failed: rejected by a server (``status`` 4xx) or out of retries (``errors``)."""

    def __init__(self, message: str, status: int | None = None, errors: list | None = None):
        super().__init__(message)
        self.status = status
        self.errors = errors or []


class RemoteInferenceEngine(RolloutControl):
    def __init__(
        self, config: InferenceEngineConfig, clock: VersionClock | None = None,
        protocol: GenerateProtocol = SGLANG,
    ):
        super().__init__(config, clock)  # the clock, the loop thread and the executor
        self.protocol = protocol
        self.addresses: list[str] = []
        self.pool: ServerRouter | None = None
        # Keys from the config or AREALITE_API_KEY / AREALITE_ADMIN_API_KEY; the api key's
        # header is a default of every session (built once), the admin key's goes on admin calls.
        self.keys = ClientKeys.from_config(config.api_key, config.admin_api_key)
        self._admin_headers = self.keys.admin_headers
        self.weight_sync = WeightSync(config.pause_mode, config.weight_update_timeout,
                                      admin_headers=self._admin_headers, protocol=protocol)
        self.last_weight_update = None  # WeightUpdateReport of the last successful update
        self._sessions = SessionCache(self.keys.api_headers)
        self._updating = False  # between pause_generation and continue_generation
        self._last_disk: WeightUpdateMeta | None = None
        self._health_task: Any = None
        self._segment_ids = itertools.count(1)  # next() is atomic: shared by threads
        # routed-expert ids per token the trainer expects (its MoE layers x top_k), checked on
        # every answer when set (routing replay); None takes what the servers send
        self.routed_experts_width: int | None = None
        self.observer: RolloutObserver | None = None  # told of requests and pushes (set_observer)
        self.verifier = WeightVerifier(self.weight_sync, config.weight_update_timeout,
                                       self._admin_headers)
        self.adapters = AdapterVersions(config.max_head_offpolicyness)  # LoRA runs' adapters

    # ------------------------------------------------------------------ lifecycle

    def initialize(
        self, addr: str | list[str] | None = None, train_data_parallel_size: int | None = None
    ) -> None:
        addrs = parse_addrs(addr) or parse_addrs(self.config.server_addrs)
        addrs = addrs or parse_addrs(os.environ.get(ADDRS_ENV))
        if not addrs:
            raise ValueError(
                f"no server addresses: pass addr=, set rollout.server_addrs, or {ADDRS_ENV}"
            )
        c = self.config
        self.addresses = addrs
        self.pool = ServerRouter(addrs, c.schedule_policy, c.sticky_rids, c.unhealthy_after_failures)
        self.verifier.pool = self.pool
        self._urls = {a: f"http://{a}{self.protocol.generate_path}" for a in addrs}
        self.executor.initialize(train_data_parallel_size or 1)
        self.loop.start(self.executor.launch_ready)  # ours, lent to the executor's episodes
        fut = self.loop.run(wait_healthy(self._sessions, addrs, c.setup_timeout, self.keys,
                                         self.protocol))
        try:
            fut.result(c.setup_timeout + 10)
        except BaseException:
            self.destroy()
            raise
        self._health_task = self.loop.run(self._health_loop())

    def destroy(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            self._health_task = None
        if self.loop.alive:
            self.loop.stop(self.executor.shutdown(self._cleanup))

    async def _cleanup(self) -> None:
        if self.pool is not None and self.weight_sync.group is not None:
            try:
                await self.weight_sync.destroy_group(self._sessions.get(), self.pool.healthy_addrs())
            except Exception as e:  # noqa: BLE001 - best effort at shutdown
                logger.warning("destroying the weight-update group: %s", describe_error(e))
        await self._sessions.close_current()

    def set_observer(self, observer: RolloutObserver | None) -> None:
        """Tell ``observer`` of this client's requests and weight pushes and of its executor's
        episodes (one at a time; ``None`` detaches). Unobserved, no hook is called."""
        self.observer = self.executor.observer = observer

    # ------------------------------------------------------------------ generation

    async def agenerate(self, req: ModelRequest,
                        _seen: tuple[RolloutObserver, Any] | None = None) -> ModelResponse:
        """One sample for ``req``: segments (a pause for a weight update aborts one; the next
        resumes with prompt + tokens so far) and, within each, attempts on healthy servers.

        One coroutine frame for all of it, segments and attempts as loops, not awaited helpers:
        every await level costs on each resume of this hot path (benchmarks/micro/client_overhead.py).
        Observed, it runs inside ``_observed``, which hands in ``_seen`` (the observer and its
        record of the request) for the attempts' hooks: unobserved, no hook and no await level.
        """
        if _seen is None and self.observer is not None:
            return await self._observed(self.observer, req)
        ids_json = req.validate()
        pool = self.pool
        if pool is None:
            raise RuntimeError("RemoteInferenceEngine.initialize() has not been called")
        g = req.gconfig
        if g.n_samples != 1:
            raise ValueError(
                f"agenerate makes one sample (n_samples={g.n_samples}): call it once per sample"
            )
        rid, max_new = req.rid, g.max_new_tokens
        start_version = self.clock.value
        t0 = time.monotonic()
        session, watch = self._sessions.get_with_watch()
        task = asyncio.current_task()
        # The response's own copy of the prompt (never mutated) is also the first body's ids.
        prompt = list(req.input_ids)
        proto = self.protocol
        images = req.image_data  # sent again with every segment: the prompt holds their tokens
        lora = self.adapters.current  # (name, version): every token of a segment is its version
        body = proto.encode_generate_body(prompt, g, max_new, self._segment_rid(rid), 0, ids_json,
                                          lora and lora[0])
        body = proto.add_image_data(body, images) if images else body
        tokens: list[int] | None = None  # then the first segment's lists, no copies
        routed = None  # with g.return_routed_experts: rows joined over the segments
        logprobs: list[float] | None = None
        versions: list[int] | None = None
        ttft = None
        empty_aborts = 0
        while True:  # one pass per segment
            errors: tuple[tuple[str, str], ...] = ()  # (server, reason) per failed attempt
            tried: frozenset[str] = _NO_SERVERS
            for attempt in range(self.config.request_retries + 1):
                if attempt:  # backoff: 0.1, 0.2, 0.4, ... 2 s
                    await asyncio.sleep(min(0.1 * 2 ** (attempt - 1), 2.0))
                try:
                    addr = pool.choose(rid, tried, True)
                except NoHealthyServer as e:
                    errors += (("pool", str(e)),)
                    # wait for the health probe to re-admit a server
                    await asyncio.sleep(self.config.health_check_interval)
                    continue
                ok = fired = False
                if _seen is not None:
                    tried_at = time.perf_counter()
                url = self._urls[addr]
                try:
                    watch.add(task, time.monotonic() + self.config.request_timeout)
                    try:
                        # what aiohttp's json= sends, with the body already encoded
                        data = aiohttp.BytesPayload(body, content_type="application/json")
                        async with session.post(url, data=data) as r:
                            raw = await r.read()
                            status = r.status
                    finally:
                        fired = watch.remove(task)
                    if status == 200:
                        seg = proto.parse_generate_response(json.loads(raw), start_version)
                        if lora is not None:
                            seg.versions = [lora[1]] * len(seg.output_ids)
                        ok = True
                        break
                    reason = self._rejection(rid, addr, status, raw, r.headers)
                except asyncio.CancelledError:
                    if not fired:  # cancelled from elsewhere, not by our deadline
                        raise
                    uncancel(task)
                    reason = "timed out"
                except (ProtocolError, json.JSONDecodeError, *TRANSPORT_ERRORS) as e:
                    reason = describe_error(e)
                finally:
                    pool.release(addr, ok)
                    if _seen is not None:
                        _seen[0].on_request_attempt(_seen[1], addr, tried_at, ok)
                pool.record_failure(addr, reason)
                errors += ((addr, reason),)
                tried |= {addr}
                logger.warning("request %s failed on %s (%s); retrying elsewhere", rid, addr, reason)
            else:
                raise GenerationError(
                    f"request {rid} failed after {attempt + 1} attempt(s): "
                    + "; ".join(f"{a}: {r}" for a, r in errors),
                    errors=list(errors),
                )
            if g.return_routed_experts:
                try:
                    routed = join_segment(routed, seg, len(prompt) + len(tokens or ()),
                                          self.routed_experts_width)
                except RoutedExpertsError as e:
                    raise GenerationError(f"request {rid} on {addr}: {e}") from e
            if not tokens:
                tokens, logprobs, versions = seg.output_ids, seg.logprobs, seg.versions
            else:
                tokens += seg.output_ids
                logprobs += seg.logprobs
                versions += seg.versions
            if seg.finish_type != "abort":
                stop_reason = seg.finish_type
                break
            if ttft is None and seg.output_ids:  # else the latency, once finished
                ttft = time.monotonic() - t0
            done = len(tokens)
            if done >= max_new:
                stop_reason = "length"  # cut exactly at the last token
                break
            empty_aborts = empty_aborts + 1 if not seg.output_ids else 0
            if empty_aborts > MAX_EMPTY_ABORTS:
                raise GenerationError(
                    f"request {rid}: aborted {empty_aborts} times in a row before producing a "
                    f"token (last: {seg.finish_message!r} from {addr})"
                )
            await self._wait_unpaused(rid)
            if empty_aborts:  # repeated empty aborts while not paused: do not spin
                await asyncio.sleep(min(0.05 * empty_aborts, 1.0))
            lora = self.adapters.current
            if g.constrained:  # a grammar sent again starts over: regenerate from the prompt
                tokens = logprobs = versions = routed = None
                body = proto.encode_generate_body(prompt, g, max_new, self._segment_rid(rid), 0,
                                                  ids_json, lora and lora[0])
                body = proto.add_image_data(body, images) if images else body
                continue
            body = proto.encode_generate_body(prompt + tokens, g, max_new - done,
                                              self._segment_rid(rid), done, None, lora and lora[0])
            body = proto.add_image_data(body, images) if images else body
            if routed is not None:  # only the rows past those held
                body = proto.add_routed_experts_start(body, len(routed))
        latency = time.monotonic() - t0
        resp = ModelResponse(
            prompt, tokens, logprobs, versions, stop_reason, latency,
            latency if ttft is None else ttft, addr, seg.scores,
        )
        if g.return_routed_experts:
            try:
                resp.routed_experts = check_complete(routed, len(prompt) + len(tokens), rid)
            except RoutedExpertsError as e:
                raise GenerationError(str(e)) from e
        return resp

    async def _observed(self, obs: RolloutObserver, req: ModelRequest) -> ModelResponse:
        """``agenerate`` with ``obs`` told of the request's start, each attempt and its end."""
        rec = obs.on_request_start(req.rid)
        outcome = "error"
        try:
            resp = await self.agenerate(req, (obs, rec))
            outcome = resp.stop_reason
            return resp
        finally:
            obs.on_request_end(rec, outcome)

    async def agenerate_group(self, reqs: list[ModelRequest]) -> list[ModelResponse]:
        """A GRPO group's samples in one batched call where the protocol has one
        (``rollout.group_generate``); each response as ``agenerate`` would give it. Observed,
        one by one, so that each request is seen with its own segments."""
        if self.observer is not None:
            return list(await asyncio.gather(*(self.agenerate(r) for r in reqs)))
        return await generate_group(self, reqs)

    def _segment_rid(self, rid: str) -> str:
        # Each segment has its own server-side rid, so a resubmission never collides with a
        # server's record of the previous one (next() is atomic: the engine is shared by threads).
        return f"{rid}-{next(self._segment_ids)}"

    @staticmethod
    def _rejection(rid: str, addr: str, status: int, raw: bytes, headers: Any) -> str:
        """The reason a non-200 answer gives for retrying elsewhere; a 4xx that is the
        request's own fault raises ``GenerationError`` with the server's message instead."""
        msg = error_message(decode_body(raw, headers.get("Content-Type")))
        if status not in RETRYABLE_STATUS and status < 500:
            if status == 401:
                msg += f" ({HINT['api']})"
            raise GenerationError(f"request {rid} rejected by {addr} (HTTP {status}): {msg}", status)
        return f"HTTP {status}: {msg}"

    async def _wait_unpaused(self, rid: str) -> None:
        """Wait while the engine is paused, at most ``request_timeout`` seconds."""
        deadline = time.monotonic() + self.config.request_timeout
        while self._updating or self.executor.paused:
            if time.monotonic() >= deadline:
                raise GenerationError(
                    f"request {rid}: the engine stayed paused for request_timeout "
                    f"({self.config.request_timeout:.0f} s)"
                )
            await asyncio.sleep(0.05)

    # ------------------------------------------------------------------ health

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.health_check_interval)
            bad = self.pool.unhealthy_addrs()
            if bad and not self._updating:
                await asyncio.gather(*(self._probe(a) for a in bad), return_exceptions=True)

    async def _probe(self, addr: str) -> None:
        if addr in self.verifier.quarantined:
            return
        current = self.clock.value  # an update finishing meanwhile makes this probe stale
        ok = await (self.adapters.readmit(self._sessions.get(), addr, self.weight_sync)
                    if self.adapters.current else ready_for_readmission(
            self._sessions.get(), addr, current, self._last_disk,
            max(5.0, self.config.health_check_interval), self.config.weight_update_timeout,
            self._admin_headers, self.protocol))
        if ok and not self._updating and self.clock.value == current:
            self.pool.mark_healthy(addr)

    # ------------------------------------------------------------------ weights

    def update_weights(self, meta: WeightUpdateMeta) -> Future:
        """Start moving every healthy server to ``meta.version`` (the transport's client half)."""
        if self.pool is None:
            raise RuntimeError("RemoteInferenceEngine.initialize() has not been called")
        t0 = time.perf_counter()
        fut = self.loop.run(self._update_weights(meta))
        if self.observer is not None:
            self._observe_update(self.observer, meta, t0, fut)
        return fut

    def _observe_update(self, obs: RolloutObserver, meta: WeightUpdateMeta, t0: float,
                        fut: Future) -> None:
        def done(f: Future) -> None:
            ok = not f.cancelled() and f.exception() is None
            obs.on_weight_update(meta, t0, time.perf_counter(), ok, self.last_weight_update)

        fut.add_done_callback(done)

    def _set_updating(self, on: bool) -> None:
        # While set, aborted requests wait before resubmitting and the probe re-admits nobody.
        self._updating = on

    async def _update_weights(self, meta: WeightUpdateMeta) -> None:
        targets = self.pool.healthy_addrs()
        if not targets:
            raise WeightUpdateError("no healthy server to update: " + self.pool.describe())
        # the transport the update names (arealite.weights.table), handed the pool
        transport = transport_for(meta, native=self.weight_sync.native is not None)
        pool = PoolSide(self._sessions.get(), self.weight_sync, self.adapters, self._set_updating)
        try:
            report = await transport.update(pool, targets, meta)
        except WeightUpdateError as e:
            for a, r in (e.report.failed if e.report else {}).items():
                self.pool.mark_unhealthy(a, f"weight update to v{meta.version} failed: {r}")
            raise
        finally:
            self._updating = False
        for a, r in report.failed.items():
            self.pool.mark_unhealthy(a, f"weight update to v{meta.version} failed: {r}")
        if report.failed:
            logger.error("weight update v%d: servers taken out: %s", meta.version, report.failed)
        disk = transport.disk_copy(meta)
        self._last_disk = disk or self._last_disk  # for re-admissions
        if meta.verify:
            await self.verifier.after_update(self._sessions.get(), report, meta, disk is not None)
        self.last_weight_update = report
        self.set_version(meta.version)

    def resync_weights(self, meta: WeightUpdateMeta, addrs: list[str]) -> Future:
        """A second broadcast update to just ``addrs`` (``report.resync`` of the update to
        ``meta.version``; the trainer uploads ``meta`` again at the same time, as for any
        update), then verification: they rejoin the pool, or ``WeightVerificationError``."""
        async def go() -> None:
            session = self._sessions.get()
            transport = transport_for(meta, native=self.weight_sync.native is not None)
            report = await self.weight_sync.run(session, list(addrs), meta, transport=transport)
            missing = [a for a in addrs if a not in report.updated]
            bad = {a: report.failed.get(a, "not updated") for a in missing}
            if meta.verify and not bad:
                bad = await self.verifier.check(session, list(addrs), meta)
            self.verifier.admit(list(addrs), meta, bad)

        return self.loop.run(go())

    def weight_group_layout(self, timeout: float = 30.0) -> GroupLayout:
        """World size, rank offsets and backend a new weight-update group over the healthy
        servers would use (``update_weights`` also publishes ``meta.world_size`` itself)."""
        async def go() -> GroupLayout:
            return await group_layout(self._sessions.get(), self.pool.healthy_addrs(), timeout)

        return self.loop.run(go()).result(timeout + 5)

    def get_weights_by_name(self, name: str, truncate_size: int = 100,
                            timeout: float = 60.0) -> dict[str, Any]:
        """``/get_weights_by_name`` on every healthy server: ``{addr: values}``."""
        async def go() -> dict[str, Any]:  # the session belongs to the engine's loop
            addrs = self.pool.healthy_addrs()
            return await fetch_weights(self._sessions.get(), addrs, name, truncate_size, timeout,
                                       self._admin_headers)

        return self.loop.run(go()).result(timeout + 5)

    def verify_weights(self, expected: dict[str, torch.Tensor], atol: float = 1e-5,
                       truncate_size: int = 100) -> None:
        """Raise ``WeightUpdateError`` if any healthy server's ``get_weights_by_name`` differs
        from ``expected`` (over the first ``truncate_size`` rows, as the endpoint returns)."""
        bad = []
        for name, t in expected.items():
            fetched = self.get_weights_by_name(name, truncate_size)
            bad += weight_mismatches(name, t, fetched, truncate_size, atol)
        if bad:
            raise WeightUpdateError("servers' weights differ from the trainer's: " + "; ".join(bad))
