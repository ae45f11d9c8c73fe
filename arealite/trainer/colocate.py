"""Co-located mode's phase switches (``launcher.colocate``): servers and trainer share a host
and take turns with its memory.

One step: ``offload_actor`` (the trainer's model and optimizer state to host memory, on
accelerators) -> generate (servers hold their weights and KV cache) -> ``release``: servers paused and their memory released
(``/release_memory_occupation``, tags ``weights`` and ``kv_cache``), the actor back on its
device -> train (the reference model on its device only for its log-probabilities) ->
``resume``: servers get their memory back (``/resume_memory_occupation``) -> push the new
weights (``weight_update.type: tensor``, by shared memory) -> save, evaluate, log (the actor
still on its device).

Each transition is logged with its time and the memory it freed: host memory (``MemAvailable``,
the whole host: the servers are on it) and, on accelerators, this device's free memory. The
figures go to the step's stats as ``colocate/<transition>_seconds`` and ``_freed_mib`` (on CUDA
also ``_device_freed_mib`` and ``_device_used_before_mib``, the device's alone). On a
CPU host the trainer's offloads free nothing (its model is host memory already: see
``arealite/engine/offload.py``); the servers' release does (weights spilled, KV cache freed).

A reward-model pool (``reward_model``) takes the same turns: its servers' memory is released
with the generation servers' after generation (every sample of the step is scored by then: the
sync rollout returns scored episodes) and resumed with theirs; a score asked for meanwhile waits
on the server until the resume.

``launcher.colocate_servers: recreate`` replaces release and resume by stopping the server
processes (``stop_servers``: everything they held goes back) and starting them again
(``start_servers``), both done by the local launcher on rank 0's request
(``arealite/launcher/server_cycle.py``); the push that follows gives the new servers the newest
weights and version.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from arealite.engine.offload import move_to
from arealite.launcher.server_cycle import ServerCycleClient
from arealite.observe import stats_tracker
from arealite.utils.memory import host_available_bytes
from arealite.utils.sync_http import admin_headers, post_json

logger = logging.getLogger("arealite.trainer.colocate")

SERVER_TAGS = ["weights", "kv_cache"]


def _device_free_bytes(device: torch.device) -> int:
    if device.type == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.mem_get_info(device)[0])
    return 0


class ColocatedPhases:
    """The switches of one trainer rank; rank 0 also drives the servers."""

    def __init__(self, rollout, actor, ref, rank: int, timeout: float = 120.0,
                 reward_model=None, recreate: bool = False, start_timeout: float = 300.0) -> None:
        self.rollout, self.actor, self.ref, self.rank = rollout, actor, ref, rank
        self.reward_model = reward_model  # its pool's client (RemoteRewardModelEngine) or None
        self.timeout, self.start_timeout = timeout, start_timeout
        # recreate: the launcher stops and starts the servers (rank 0 asks; fails fast when
        # no launcher serves the requests)
        self.cycle = ServerCycleClient.from_env() if recreate and rank == 0 else None
        self.recreate = recreate
        self.device = torch.device(getattr(actor, "device", "cpu"))
        self.released = False

    def _transition(self, name: str, fn: Callable[[], None]) -> None:
        host0, dev0, t0 = host_available_bytes(), _device_free_bytes(self.device), time.perf_counter()
        fn()
        secs = time.perf_counter() - t0
        host = (host_available_bytes() - host0) / 2**20
        dev = (_device_free_bytes(self.device) - dev0) / 2**20
        logger.info("colocate: %s in %.3f s; memory freed: host %+.1f MiB%s", name, secs, host,
                    f", {self.device} {dev:+.1f} MiB" if self.device.type != "cpu" else "")
        with stats_tracker.scope("colocate"):
            stats_tracker.scalar(**{f"{name}_seconds": secs, f"{name}_freed_mib": host + dev})
            if self.device.type == "cuda":  # the device alone, and how much was in use before
                total = torch.cuda.mem_get_info(self.device)[1]
                stats_tracker.scalar(**{f"{name}_device_freed_mib": dev,
                                        f"{name}_device_used_before_mib": (total - dev0) / 2**20})

    def _servers(self, path: str, body: dict, engine=None) -> None:
        """``path`` on every healthy server of ``engine``'s pool (the rollout's by default)."""
        if self.rank != 0:
            return
        errors = []
        addrs = (engine or self.rollout).pool.healthy_addrs()
        if engine is self.reward_model and engine is not None:
            logger.info("colocate: %s on the reward-model servers %s", path, ",".join(addrs))
        for addr in addrs:
            _, reason = post_json(addr, path, body, self.timeout, admin_headers())
            if reason is not None:
                errors.append(f"{addr}: {reason}")
        if errors:
            raise RuntimeError("co-located phase switch failed: " + "; ".join(errors))

    def release(self) -> None:
        """After generation: servers paused and their memory released; the actor onloaded."""
        def go() -> None:
            self.rollout.pause()  # no new episode while the servers are released
            self._servers("/pause_generation", {"mode": "abort"})
            self._servers("/release_memory_occupation", {"tags": SERVER_TAGS})
            if self.reward_model is not None:
                self._servers("/release_memory_occupation", {"tags": SERVER_TAGS},
                              self.reward_model)
            self.released = True

        def stop() -> None:
            self.rollout.pause()  # no new episode while the servers are gone
            if self.cycle is not None:
                logger.info("colocate: %s", self.cycle.request("stop", self.timeout))
            if self.reward_model is not None:  # not recreated: released as in release mode
                self._servers("/release_memory_occupation", {"tags": SERVER_TAGS},
                              self.reward_model)
            self.released = True
        if self.recreate:
            self._transition("stop_servers", stop)
        else:
            self._transition("release_servers", go)
        self._transition("onload_actor", lambda: move_to(self.actor.model, self.actor.optimizer,
                                                         self.device))

    def ref_logp(self, batch) -> torch.Tensor:
        """The reference model's log-probabilities, with it on its device only meanwhile."""
        self._transition("onload_ref", lambda: move_to(self.ref.model, None, self.device))
        out = self.ref.compute_logp(batch)
        self._transition("offload_ref", lambda: move_to(self.ref.model, None, "cpu"))
        return out

    def resume(self) -> None:
        """After training, before the push: servers get their memory back (still paused; the
        push's ``/continue_generation`` lets them go)."""
        def go() -> None:
            self._servers("/resume_memory_occupation", {"tags": SERVER_TAGS})
            if self.reward_model is not None:
                self._servers("/resume_memory_occupation", {"tags": SERVER_TAGS},
                              self.reward_model)
            self.released = False

        def start() -> None:  # on the model they were launched with, until the push
            if self.cycle is not None:
                logger.info("colocate: %s", self.cycle.request("start", self.start_timeout))
            if self.reward_model is not None:
                self._servers("/resume_memory_occupation", {"tags": SERVER_TAGS},
                              self.reward_model)
            self.released = False
        self._transition("start_servers" if self.recreate else "resume_servers",
                         start if self.recreate else go)

    def offload_actor(self) -> None:
        """Before generation: the actor's model and optimizer state to host memory."""
        self._transition("offload_actor", lambda: move_to(self.actor.model, self.actor.optimizer,
                                                          "cpu"))
