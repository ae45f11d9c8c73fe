"""The rollout executor's loop side (``executor.py``'s ``WorkflowExecutor`` mixes it in): on
each wake-up of the event loop, start every queued episode the staleness gate admits and the
output bound has room for, run the workflow's ``arun_episode``, and file its outcome under the
executor's condition lock.

An accepted trajectory is checked (``check_trajectory``), stamped with its episode serial and
data epoch, and queued for the trainer side; a rejected one only counted. A failed episode is
counted and logged; a dataloader row is drawn again (``data_cycle.py``), a ``rollout_batch``
row run again up to ``episode_retries`` times, then dropped and counted. The queue items
(``PendingEpisode``: queued or running; ``EpisodeResult``: finished) are defined here.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import torch

from arealite.api.trajectory import (
    DATA_EPOCHS_KEY,
    EPISODE_IDS_KEY,
    TensorDict,
    check_trajectory,
)
from arealite.api.workflow_api import RolloutWorkflow

logger = logging.getLogger("arealite.rollout.episode_runner")


@dataclass
class PendingEpisode:
    """A row queued for its episode, or running it."""

    data: Any
    workflow: RolloutWorkflow
    group: int | None  # rollout_batch's own episodes; None for the shared queue
    attempts: int = 0  # earlier failed episodes of this row (prepare_batch draws it again)
    observed: Any = None  # the observer's record of its submission
    epoch: int = -1  # the epoch its dataloader row was drawn in (-1: no dataloader)


@dataclass
class EpisodeResult:
    """A finished episode's trajectory, queued for the trainer side."""

    traj: TensorDict
    start_version: int
    group: int | None
    data: Any = None  # the row it came from: in flight until trained (see inflight_data)
    attempts: int = 0
    epoch: int = -1


class EpisodeRunner:
    """Launching and running episodes on the loop (mixed into ``WorkflowExecutor``, whose
    queues, gate and counters it uses under its condition lock)."""

    def launch_ready(self) -> None:
        """The loop's step: start every queued episode the gate admits (run on each wake-up)."""
        g = self.gate
        while not self._paused and not self._held and not self._lt.stopping:
            with self._cond:
                if not self._input:
                    return
                if len(self._results) + g.stat().running >= self.queue_size:
                    return  # output backpressure: the trainer has to consume first
                if not g.try_start():
                    return
                item = self._input.popleft()
                key = next(self._launches)
                serial = self._accounts.next_serial()
                if not self._running:
                    self._idle.busy()
                self._running[key] = item
                start_version = g.version
                self._starts[key] = (item.group, start_version)
                self._cond.notify_all()  # room in the input queue
            self._lt.spawn(self._run_episode(key, item, start_version, serial))

    async def _run_episode(self, key: int, item: PendingEpisode, start_version: int,
                           serial: int = -1) -> None:
        g = self.gate
        obs = self.observer
        seen = None if obs is None else obs.on_episode_start(item.observed)  # in this task
        outcome = "failed"
        try:
            traj = await item.workflow.arun_episode(self.engine, item.data)
            outcome = "rejected" if traj is None else "accepted"
            if traj is not None:
                check_trajectory(traj)
                n = next(iter(traj.values())).shape[0]
                traj[EPISODE_IDS_KEY] = torch.full((n,), serial, dtype=torch.long)
                traj[DATA_EPOCHS_KEY] = torch.full((n,), item.epoch, dtype=torch.long)
        except asyncio.CancelledError:
            g.on_fail()
            with self._cond:
                self._end_locked(key)
            raise
        except Exception as e:  # noqa: BLE001 - a workflow bug must not kill the loop
            g.on_fail()
            self._fail_streak += 1
            self._last_failure = f"{type(e).__name__}: {e}"
            logger.exception("workflow %s failed on one episode", type(item.workflow).__name__)
            with self._cond:
                self._end_locked(key)  # notifies the waiters
                if item.group is None:  # a dataloader row: drawn again, or dropped and counted
                    self._data.redraw(item.data, item.attempts, self.episode_retries, item.epoch)
                    self._finish_group_locked(item.group)
                elif item.attempts < self.episode_retries:  # rollout_batch's: run it again
                    item.attempts += 1
                    self._data.redrawn += 1
                    self._input.appendleft(item)
                    self.gate.on_submit()
                else:  # rollout_batch's, out of retries: the step goes on without it
                    self._data.drop(item.data, item.attempts + 1, item.epoch, "failed")
                    self._finish_group_locked(item.group)
        else:
            self._fail_streak = 0
            with self._cond:
                self._end_locked(key)  # with the append below: never in neither place
                if traj is None:
                    g.on_reject()
                else:
                    self._results.append(EpisodeResult(traj, start_version, item.group, item.data,
                                                 item.attempts, item.epoch))
                    self._accounts.finished(traj)
                    g.on_accept()
                self._finish_group_locked(item.group)
                self._cond.notify_all()
        finally:
            if obs is not None:
                obs.on_episode_end(seen, outcome, self.clock.value)
            self._lt.wake_here()

    def _end_locked(self, key: int) -> None:
        """Episode ``key`` is no longer running (call under ``_cond``); the last one starts idle."""
        self._running.pop(key, None)
        self._starts.pop(key, None)
        if not self._running:
            self._idle.idle()
        self._cond.notify_all()  # drain() waits for the last; a batch for a last-chance one

    def _finish_group_locked(self, group: int | None) -> None:
        if group is not None and group in self._group_done:
            self._group_done[group] += 1
