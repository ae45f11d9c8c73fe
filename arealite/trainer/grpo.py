"""GRPO: ``torchrun --nproc-per-node K -m arealite.trainer.grpo CONFIG [key=value ...]``.

One step: rollout -> recompute logp -> ref logp (-> critic values) -> advantages -> ppo_update
(-> critic update) -> pause, upload and update weights, resume, version + 1 (-> consistency
gate, when due) -> save / evaluate / log / recovery checkpoint. The run ends after
``total_train_steps`` or, with ``total_train_seconds``, after the step that uses up the budget
(evaluations excluded).
Evaluation (``evaluator.eval_fn`` or mean greedy reward) runs with no training episode in flight
and is timed as ``timeperf/eval``. The engines and the phases of a step are
``trainer/rl_engines.py``'s; recovery and what follows a step, ``trainer/rl_run.py``'s. Server
addresses come from ``rollout.server_addrs`` or ``AREAL_LLM_SERVER_ADDRS`` (the launcher sets
it).
"""

from __future__ import annotations

import sys

import torch

from arealite.api.config.experiment import GRPOConfig
from arealite.trainer.common import config_from_argv, dist_info, setup_logging
from arealite.trainer.rl_engines import (
    build_rl_engines,
    gate_after_push,
    ppo_update,
    prepare_logp_and_advantages,
    rollout_batch,
    sync_weights,
)
from arealite.trainer.rl_run import recover_or_start


def main(argv: list[str] | None = None) -> int:
    config: GRPOConfig = config_from_argv(argv, GRPOConfig)
    rank, world = dist_info()
    setup_logging(rank)
    torch.manual_seed(config.seed + rank)
    # data, rollout and evaluation clients, actor (+ ref, critic, reward model), workflows
    engines = build_rl_engines(config, rank, world)
    # weights, optimizer, data position, schedules and version from the newest recovery
    # checkpoint (then the servers get those weights), or step 0 after an initial evaluation
    run = recover_or_start(config, engines)
    for step in range(run.start_step, engines.total_steps):
        batch = rollout_batch(engines)  # async: prepare_batch; sync: rollout_batch
        prepare_logp_and_advantages(engines, batch)  # recomputed, ref (, critic values)
        stats = ppo_update(engines, batch)  # actor (, critic)
        sync_weights(engines, version=step + 1)  # pause, push, resume
        gate_after_push(engines, version=step + 1)  # when due: servers' log-probs vs the trainer's
        # save, evaluate, log, recovery checkpoint; True once the time budget is used up
        if run.after_step(engines, step, batch, stats):
            break
    run.close(engines)
    engines.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
