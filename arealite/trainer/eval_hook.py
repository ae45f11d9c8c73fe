"""Held-out evaluation of the RL entry scripts: the user's function (``evaluator.eval_fn``) or
the default one (``observe/heldout_eval.py``: right, exact, format, score, collapse), run while no training episode is in flight and timed apart.

Why quiescent: an evaluation that shares the servers with running training episodes measures a
busy pool and slows both; ``drain`` lets the running episodes finish (their trajectories stay
queued for the next batch) and starts no new one until the evaluation is over. Its seconds go to
``timeperf/eval`` and are excluded from the training clock (``TrainClock``), so wall-clock
comparisons and ``total_train_seconds`` count training only.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist

from arealite.api.config.run import EvaluatorConfig
from arealite.api.engine_api import InferenceEngine
from arealite.api.eval_api import EvalFn, load_eval_fn  # noqa: F401 - load_eval_fn: re-exported
from arealite.api.eval_api import context_for as _context_for
from arealite.api.workflow_api import RolloutWorkflow
from arealite.observe import trace
from arealite.observe.heldout_eval import evaluate


class TrainClock:
    """Training wall-clock time: ``already`` (seconds before a restart) plus the seconds since
    construction, minus those spent in ``paused`` blocks (evaluations)."""

    def __init__(self, already: float = 0.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._t0 = clock() - float(already)
        self._excluded = 0.0

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        t = self._clock()
        try:
            yield
        finally:
            self._excluded += self._clock() - t

    def elapsed(self) -> float:
        return self._clock() - self._t0 - self._excluded


def run_evaluation(
    train_rollout: Any,
    engine: InferenceEngine,
    workflow: RolloutWorkflow,
    rows: list[dict[str, Any]],
    config: EvaluatorConfig,
    eval_fn: EvalFn | None = None,
    context: dict[str, Any] | None = None,
    evaluate_here: bool = True,
    drain_timeout: float | None = None,
    sample_workflow: RolloutWorkflow | None = None,
) -> dict[str, float]:
    """Drain the training rollout (no episode in flight), evaluate, start it again; returns the
    evaluation's stats plus ``timeperf/eval`` (drain included: it is time not spent training).
    Collective when torch.distributed is up: every rank drains its own episodes and waits
    while the rank with ``evaluate_here`` (rank 0) evaluates. ``sample_workflow``: the default
    evaluation's sampler for pass@k (``evaluator.pass_k``)."""
    t0 = time.perf_counter()
    executor = getattr(train_rollout, "executor", None)
    out: dict[str, float] = {}
    try:
        if executor is not None:
            executor.drain(drain_timeout)
        if dist.is_initialized():
            dist.barrier()  # every rank's episodes are done: the servers are quiet
        if evaluate_here:
            out = _evaluate(engine, workflow, rows, config, eval_fn, context, sample_workflow)
        if dist.is_initialized():
            dist.barrier()
    finally:
        if executor is not None:
            executor.undrain()
    t1 = time.perf_counter()
    out["timeperf/eval"] = t1 - t0
    if trace.TRACER is not None:  # between steps on the timeline (stats_logger.trace)
        trace.TRACER.complete("eval", "timeperf", trace.TRAINER_TID, t0, t1)
    return out


def _evaluate(engine: InferenceEngine, workflow: RolloutWorkflow, rows: list[dict[str, Any]],
              config: EvaluatorConfig, eval_fn: EvalFn | None, context: dict[str, Any] | None,
              sample_workflow: RolloutWorkflow | None = None) -> dict[str, float]:
    out = _evaluate_rows(engine, workflow, rows, config, eval_fn, context, sample_workflow)
    if config.lm_eval.tasks:  # lm-eval's tasks against the same servers, logged alongside
        from arealite.trainer.lm_eval_tasks import run_lm_eval

        tok = (context or {}).get("tokenizer")
        path = getattr(tok, "name_or_path", None)
        if not path:
            raise RuntimeError("lm-eval tasks need the run's tokenizer path")
        out.update(run_lm_eval(config.lm_eval, list(getattr(engine, "addresses", [])), path)[0])
    return out


def _evaluate_rows(engine: InferenceEngine, workflow: RolloutWorkflow, rows: list[dict[str, Any]],
                   config: EvaluatorConfig, eval_fn: EvalFn | None,
                   context: dict[str, Any] | None,
                   sample_workflow: RolloutWorkflow | None = None) -> dict[str, float]:
    rows = rows[: config.max_prompts] if config.max_prompts else rows
    if eval_fn is None:
        ctx = context or {}
        run = ctx.get("config")
        log_dir = run.run_dir("logs") if hasattr(run, "run_dir") else None
        return evaluate(engine, workflow, rows, config, ctx.get("tokenizer"), sample_workflow,
                        log_dir, ctx.get("version"))
    ctx = {"workflow": workflow, **(context or {})}
    out = eval_fn(engine, rows, **_context_for(eval_fn, ctx))
    if not isinstance(out, dict):
        raise TypeError(f"evaluator.eval_fn returned {type(out).__name__}, not a dict")
    return {k if "/" in k else f"eval/{k}": float(v) for k, v in out.items()}
