"""Measurements around the async-vs-sync runs (``benchmarks/studies/async_vs_sync.py``):

- ``CoreMeter``: the cores each process kind (server, trainer, torchrun agent) uses in the
  steady state of a run, from psutil CPU times sampled between its first and last step;
- ``profile_trainer``: recompute-logp and PPO-update time on one long-tailed batch at several
  micro-batch token budgets, each in a fresh process (``python -m benchmarks.harness.run_probes
  BUDGET ...``). With a dense block-causal mask (attn_impl sdpa/eager) its cost grows with the
  square of the budget; with the default segment attention, with Σ Lᵢ².
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path


class CoreMeter:
    """Cores used by the run's processes in the steady state: a thread samples the CPU time of
    the launcher's children (server, trainer, torchrun agent) every 0.5 s and keeps the samples
    taken between the first and the last step record of the metrics file."""

    KINDS = (("servers.launch_server", "server"), ("sglang.launch_server", "server"),
             ("torchrun", "torchrun agent"), ("arealite.trainer", "trainer"))

    def __init__(self, metrics: Path, steps: int) -> None:
        self.metrics, self.steps = metrics, steps
        self.first: tuple[float, dict[str, float]] | None = None
        self.last: tuple[float, dict[str, float]] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> dict[str, float]:
        import psutil

        out: dict[str, float] = {}
        for p in psutil.Process().children(recursive=True):
            try:
                cmd = " ".join(p.cmdline())
                t = p.cpu_times()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            kind = next((k for pat, k in self.KINDS if pat in cmd), "other")
            out[kind] = out.get(kind, 0.0) + t.user + t.system
        return out

    def _step(self) -> int:
        try:
            lines = self.metrics.read_text().splitlines()
            return int(json.loads(lines[-1]).get("step", 0)) if lines else 0
        except (OSError, ValueError):
            return 0

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            step = self._step()
            if step < 1 or step >= self.steps:
                continue
            snap = (time.monotonic(), self._sample())
            self.first = self.first or snap
            self.last = snap

    def close(self) -> dict[str, float]:
        """Cores used per process kind (CPU seconds per wall second)."""
        self._stop.set()
        self._thread.join(timeout=5)
        if not self.first or not self.last or self.last[0] - self.first[0] < 1.0:
            return {}
        dt = self.last[0] - self.first[0]
        return {k: max(0.0, (v - self.first[1].get(k, 0.0)) / dt) for k, v in self.last[1].items()}


def _profile_worker(model: str, budget: int, tail_fraction: float, tail_tokens: int, batch: int) -> None:
    """Child process: time compute_logp + ppo_update on one long-tailed batch (3 reps, best)."""
    import random

    import torch

    from arealite.api.config.actor import OptimizerConfig, PPOActorConfig
    from arealite.api.io_struct import FinetuneSpec
    from arealite.api.trajectory import pad_sequences_to_tensors
    from arealite.engine.ppo.actor import FSDPPPOActor

    torch.set_num_threads(1)
    rng = random.Random(0)
    rows = []
    for _ in range(batch * 8):
        n_out = tail_tokens if rng.random() < tail_fraction else 5
        k = min(5, n_out)
        rows.append({"input_ids": [rng.randrange(3, 300) for _ in range(18 + n_out)],
                     "loss_mask": [0] * 18 + [1] * k + [0] * (n_out - k),
                     "logprobs": [0.0] * 18 + [-1.0] * n_out, "versions": [-1] * 18 + [0] * n_out,
                     "rewards": float(rng.random() < 0.4)})
    cfg = PPOActorConfig(path=model, group_size=8, max_tokens_per_mb=budget,
                         optimizer=OptimizerConfig(lr=1e-6), behav_imp_weight_cap=5.0)
    actor = FSDPPPOActor(cfg, device="cpu", backend="gloo")
    actor.initialize(ft_spec=FinetuneSpec(1, 1000, batch))
    best = (float("inf"), float("inf"))
    for _ in range(3):
        data = pad_sequences_to_tensors(rows)
        t0 = time.perf_counter()
        data["prox_logp"] = actor.compute_logp(data)
        t1 = time.perf_counter()
        actor.compute_advantages(data)
        actor.ppo_update(data)
        t2 = time.perf_counter()
        if t2 - t0 < sum(best):
            best = (t1 - t0, t2 - t1)
    actor.destroy()
    print(json.dumps({"budget": budget, "logp": best[0], "update": best[1],
                      "tokens": int(data["attention_mask"].sum())}), flush=True)


def profile_trainer(budgets: list[int], model: Path, tail_fraction: float, tail_tokens: int,
                    batch_size: int) -> list[dict[str, float]]:
    """``{"budget", "logp", "update", "tokens"}`` per budget (best of 3 repetitions)."""
    out = []
    for budget in budgets:
        cmd = [sys.executable, "-m", "benchmarks.harness.run_probes", str(budget), str(model),
               str(tail_fraction), str(tail_tokens), str(batch_size)]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, start_new_session=True)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        if p.returncode != 0 or not lines:
            raise SystemExit(f"trainer profile at budget {budget} failed:\n{p.stderr[-2000:]}")
        out.append(json.loads(lines[-1]))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="one trainer-profile measurement (see the module doc)")
    for name, typ in (("budget", int), ("model", str), ("tail_fraction", float), ("tail_tokens", int),
                      ("batch_size", int)):
        ap.add_argument(name, type=typ)
    a = ap.parse_args(argv)
    _profile_worker(a.model, a.budget, a.tail_fraction, a.tail_tokens, a.batch_size)


if __name__ == "__main__":
    main()
