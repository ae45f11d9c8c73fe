"""``RolloutControl``: the trainer's half of an ``InferenceEngine``, whatever generates: episodes
submitted and batches taken, pause and resume, the weight version, the recovery state and the
idle time, all through one ``WorkflowExecutor``.

It owns what those share with generation: the version clock (one per trainer rank, also read
by the staleness gate and shared with other engines of the rank) and the event-loop thread,
lent to the executor's episodes; a subclass runs its own coroutines (requests, weight updates,
health probes) on the same loop. ``RemoteInferenceEngine`` is the one subclass: it adds the
generation client.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from arealite.api.config.rollout import InferenceEngineConfig
from arealite.api.engine_api import InferenceEngine
from arealite.api.io_struct import VersionClock
from arealite.api.trajectory import TensorDict
from arealite.api.workflow_api import RolloutWorkflow
from arealite.rollout.executor import WorkflowExecutor
from arealite.rollout.loop_thread import LoopThread


class RolloutControl(InferenceEngine):
    def __init__(self, config: InferenceEngineConfig, clock: VersionClock | None = None) -> None:
        self.config = config
        self.clock = clock or VersionClock()  # the one weight version of this trainer rank
        self.loop = LoopThread("rollout-executor")
        self.executor = WorkflowExecutor(config, self, self.loop, self.clock)

    def submit(self, data: dict[str, Any], workflow: RolloutWorkflow) -> None:
        self.executor.submit(data, workflow)

    def wait(self, count: int, timeout: float | None = None,
             should_accept: Callable[[TensorDict], bool] | None = None) -> TensorDict:
        return self.executor.wait(count, timeout, should_accept)

    def rollout_batch(self, data: list[dict[str, Any]], workflow: RolloutWorkflow,
                      should_accept: Callable[[TensorDict], bool] | None = None) -> TensorDict:
        return self.executor.rollout_batch(data, workflow, should_accept)

    def prepare_batch(self, dataloader: Any, workflow: RolloutWorkflow,
                      should_accept: Callable[[TensorDict], bool] | None = None) -> TensorDict:
        return self.executor.prepare_batch(dataloader, workflow, should_accept)

    def data_state(self) -> dict[str, Any]:
        """``prepare_batch``'s epoch and in-flight rows, for a recovery checkpoint."""
        return self.executor.data_state()

    def load_data_state(self, state: dict[str, Any]) -> None:
        self.executor.load_data_state(state)

    def take_dropped(self) -> list[dict[str, Any]]:
        """Rows given up on since the previous call, with their reasons (the run's ledger)."""
        return self.executor.take_dropped()

    def inflight_tagged(self) -> list[tuple[Any, int]]:
        """``prepare_batch``'s rows drawn and not trained, as ``(row, epoch)``."""
        return self.executor.inflight_tagged()

    def take_generated(self) -> tuple[list[int], list[float]]:
        """Generated lengths and rewards since the previous call (``observe/length_bias.py``)."""
        return self.executor.take_generated()

    def idle_stats(self) -> dict[str, float]:
        """The executor's idle time and ratio since the previous call (see ``WorkflowExecutor``)."""
        return self.executor.idle_stats()

    def pause(self) -> None:
        self.executor.pause()

    def resume(self) -> None:
        self.executor.resume()

    def set_version(self, version: int) -> None:
        self.executor.set_version(version)  # moves self.clock (the executor's is the same)

    def get_version(self) -> int:
        return self.clock.value

    def restore(self, version: int, data_state: dict[str, Any] | None = None) -> None:
        """Resume a run at ``version`` in one call, before or after ``initialize``: the version,
        the staleness counters it implies, and (async mode) ``prepare_batch``'s data state."""
        self.executor.restore(version)
        if data_state is not None:
            self.executor.load_data_state(data_state)
