"""Per-step rollout statistics and held-out evaluation for the RL entry scripts."""

from __future__ import annotations

import threading
import time
from typing import Any

import torch

from arealite.api.config import EvaluatorConfig
from arealite.api.engine_api import InferenceEngine
from arealite.api.reward_api import reward_stats
from arealite.api.workflow_api import RolloutWorkflow


def batch_rollout_stats(batch: dict[str, torch.Tensor], rollout: Any, version: int, step_secs: float) -> dict[str, float]:
    """Reward, staleness (trainer version at the update minus each token's version), version
    span per trajectory, throughput and the executor's counters."""
    lm = batch["loss_mask"].bool()
    out: dict[str, float] = {
        "reward": batch["rewards"].float().mean().item(),
        "gen_len": lm.sum(1).float().mean().item(),
        "perf/tokens_per_sec": batch["attention_mask"].sum().item() / max(step_secs, 1e-9),
        "timeperf/step": step_secs,
    }
    if lm.any():
        v = batch["versions"]
        stale = (version - 1) - v[lm]  # weights trained at this step were version - 1
        out["staleness/avg"] = stale.float().mean().item()
        out["staleness/max"] = stale.max().item()
        for k in range(int(stale.max().item()) + 1):
            out[f"staleness/hist_{k}"] = (stale == k).float().mean().item()
        big = torch.iinfo(v.dtype).max
        vmax = torch.where(lm, v, -1).max(1).values
        vmin = torch.where(lm, v, big).min(1).values
        has = lm.any(1)
        out["version_span/mean"] = (vmax - vmin)[has].float().mean().item()
        # Invariant 4: tokens generated with the weights the trainer held while recomputing
        # logprobs must get the same logprob from server and trainer.
        fresh = lm & (v == version - 1)
        if "prox_logp" in batch and fresh.any():
            diff = (batch["logprobs"] - batch["prox_logp"]).abs()[fresh]
            out["logprob_agreement/max_abs_diff"] = diff.max().item()
            out["logprob_agreement/n_tokens"] = float(fresh.sum().item())
    counters = getattr(getattr(rollout, "executor", None), "counters", None)
    if callable(counters):
        for k, val in counters().items():
            out[f"rollout/{k}"] = float(val)
    for k, val in reward_stats().items():
        out[f"reward_fn/{k}"] = float(val)
    return out


def evaluate(
    engine: InferenceEngine,
    workflow: RolloutWorkflow,
    rows: list[dict[str, Any]],
    config: EvaluatorConfig,
) -> dict[str, float]:
    """Mean reward of ``workflow`` over the held-out rows (greedy by default: accuracy)."""
    rows = rows[: config.max_prompts] if config.max_prompts else rows
    if not rows:
        return {}
    batch = engine.rollout_batch(rows, workflow)
    return {"eval/accuracy": batch["rewards"].float().mean().item(), "eval/n": float(len(rows))}


class RolloutIdleMeter:
    """Rollout idle time: wall time during which no episode runs in the rollout executor (so
    the servers generate nothing for training). ``take()`` returns ``rollout/idle_s`` and
    ``rollout/idle_ratio`` since the previous call. The executor exposes no start/stop hooks,
    so a daemon thread samples its running count every ``interval`` seconds (microseconds of
    work per sample; resolution ``interval``). No-op for an engine without an executor."""

    def __init__(self, rollout: Any, interval: float = 0.01) -> None:
        executor = getattr(rollout, "executor", None)
        self._stat = getattr(executor, "stat", None)
        self._interval = interval
        self._lock = threading.Lock()
        self._idle = 0.0
        self._since = time.perf_counter()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if callable(self._stat):
            self._thread = threading.Thread(target=self._run, name="rollout-idle-meter", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        last = time.perf_counter()
        while not self._stop.wait(self._interval):
            try:
                running = self._stat().running
            except Exception:  # noqa: BLE001 - executor not initialized or gone: count nothing
                running = 1
            now = time.perf_counter()
            if running == 0:
                with self._lock:
                    self._idle += now - last
            last = now

    def take(self) -> dict[str, float]:
        if self._thread is None:
            return {}
        now = time.perf_counter()
        with self._lock:
            idle, self._idle = self._idle, 0.0
            span, self._since = now - self._since, now
        return {"rollout/idle_s": idle, "rollout/idle_ratio": min(1.0, idle / max(span, 1e-9))}

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
