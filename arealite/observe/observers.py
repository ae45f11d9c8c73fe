"""The trainer's observers, one object for the entry scripts: Prometheus ``/metrics``
(``stats_logger.metrics_port``) and the timeline trace (``stats_logger.trace``). Both are
fed once per step, after the step's stats are logged; off, each is a no-op. With the trace on,
the rollout client's own events reach it through a ``RolloutTrace`` attached to the client
(``set_observer``) and to the reward calls (``reward_api.set_reward_call_observer``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from arealite.api import reward_api
from arealite.observe import trace
from arealite.observe.prometheus_metrics import start_trainer_metrics, weight_bytes
from arealite.observe.rollout_trace import RolloutTrace


class StepObservers:
    def __init__(self, config: Any, rank: int, rollout: Any, actor: Any, log_dir: Path) -> None:
        sl = config.stats_logger
        self.rollout = rollout
        push = weight_bytes(actor, config.weight_update.bucket_size_mb) if rank == 0 and sl.metrics_port is not None else 0
        self.metrics = start_trainer_metrics(sl, rank, rollout, push)
        self.tracer = trace.start(Path(log_dir) / f"trace_rank{rank}.json", rank) if sl.trace else None
        if self.tracer is not None:  # after the client's initialize()
            rollout_trace = RolloutTrace()
            rollout.set_observer(rollout_trace)
            reward_api.set_reward_call_observer(rollout_trace.on_reward_call)

    def step(self, step: int, version: int, t0: float, stats: dict[str, float],
             eval_seconds: float = 0.0) -> None:
        """Step ``step`` began at ``t0`` (``time.perf_counter``) and lasted ``timeperf/step``
        plus the ``eval_seconds`` of an evaluation inside it (which ``timeperf/step`` excludes:
        in the trace the evaluation is a span inside the step)."""
        self.metrics.record_step(step, version, stats, self.rollout)
        if self.tracer is not None:
            end = t0 + stats.get("timeperf/step", 0.0) + eval_seconds
            self.tracer.complete(f"step {step}", "step", trace.TRAINER_TID, t0, end,
                                 {"step": step, "version": version, "eval_seconds": eval_seconds})
            self.tracer.flush()

    def close(self) -> None:
        if self.tracer is not None:
            self.rollout.set_observer(None)
            reward_api.set_reward_call_observer(None)
            trace.stop()
            self.tracer = None
