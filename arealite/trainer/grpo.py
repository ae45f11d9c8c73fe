"""GRPO: ``torchrun --nproc-per-node K -m arealite.trainer.grpo CONFIG [key=value ...]``.

One step: rollout -> recompute logp -> ref logp (-> critic values) -> advantages -> ppo_update
(-> critic update) -> pause, upload and update weights, resume, version + 1 -> save / recovery
checkpoint / evaluate / log. The run ends after ``total_train_steps`` or, with
``total_train_seconds``, after the step that uses up the budget (evaluations excluded). Evaluation (``evaluator.eval_fn`` or mean greedy reward) runs
with no training episode in flight and is timed as ``timeperf/eval``. Async
(``prepare_batch``, trajectories at most ``max_head_offpolicyness`` versions old) and sync
(``rollout_batch``) differ in that one call only; ``launcher.colocate`` (sync, servers on the
trainer's host) adds the phase switches of ``trainer/colocate.py``. Server addresses come from
``rollout.server_addrs`` or ``AREAL_LLM_SERVER_ADDRS`` (the launcher sets it).
"""

from __future__ import annotations

import sys
import time

import torch

from arealite.api.config import GRPOConfig
from arealite.api.io_struct import FinetuneSpec, SaveLoadMeta
from arealite.api.workflow_factory import build_workflow
from arealite.backends.registry import protocol_for
from arealite.backends.vllm.server_command import on_cpu
from arealite.dataset.loader import create_dataloader, load_rows
from arealite.engine.ppo.actor import FSDPPPOActor
from arealite.engine.ppo.critic import FSDPPPOCritic
from arealite.engine.vision_processor import vision_processor
from arealite.observe import stats_tracker
from arealite.observe.observers import StepObservers
from arealite.observe.rollout_stats import batch_rollout_stats
from arealite.observe.sample_log import SampleIdLog
from arealite.observe.stats_logger import StatsLogger
from arealite.observe.timing import FreqController, timer
from arealite.rollout.data_cycle import DataCycle
from arealite.rollout.dynamic_sampling import GroupRewardFilter, rollout_full_batch
from arealite.rollout.remote_engine import RemoteSGLangEngine
from arealite.rollout.reward_model_client import RemoteRewardModelEngine
from arealite.trainer.colocate import ColocatedPhases
from arealite.trainer.common import config_from_argv, dist_info, load_tokenizer, setup_logging
from arealite.trainer.eval_hook import TrainClock, load_eval_fn, run_evaluation
from arealite.utils import recover as rec
from arealite.utils.distributed import rank0_decides
from arealite.weights.push import WeightPushPlan, push_weights


def main(argv: list[str] | None = None) -> int:
    config: GRPOConfig = config_from_argv(argv, GRPOConfig)
    rank, world = dist_info()
    setup_logging(rank)
    torch.manual_seed(config.seed + rank)
    tokenizer = load_tokenizer(config.tokenizer_path or config.actor.path)

    # Data: each rank takes its shard of every global batch.
    train_rows = load_rows(config.train_dataset)
    valid_rows = load_rows(config.valid_dataset) if config.valid_dataset else []
    loader = create_dataloader(train_rows, config.train_dataset, config.seed, rank, world)
    ft = FinetuneSpec(config.total_train_epochs, len(train_rows), config.train_dataset.batch_size,
                      config.total_train_steps)
    total_steps = ft.total_train_steps  # also the lr schedule's length

    # Engines: the rollout client (staleness-gated), an evaluation client (no gate), the actor.
    # One version clock per rank: the rollout client's, shared by the other two.
    # The client speaks the servers' protocol (launcher.server_backend: SGLang's or vLLM's).
    protocol = protocol_for(config.launcher.server_backend)
    rollout = RemoteSGLangEngine(config.rollout, protocol=protocol)
    eval_rollout = RemoteSGLangEngine(config.rollout.model_copy(
        update={"max_head_offpolicyness": 1 << 20, "max_concurrent_rollouts": None}),
        rollout.clock, protocol)
    eval_rollout.adapters = rollout.adapters  # a LoRA run evaluates its current adapter
    actor = FSDPPPOActor(config.actor, config.device, config.dist_backend, config.seed, rollout.clock)
    actor.initialize(None, ft)
    ref = None
    if config.ref is not None:
        ref = FSDPPPOActor(config.ref, config.device, config.dist_backend, config.seed)
        ref.initialize(None, None)
    critic = None  # PPO with a learned baseline: GAE over its values, trained on the returns
    if config.critic is not None:
        critic = FSDPPPOCritic(config.critic.model_copy(update={"path": config.critic.path or config.actor.path}),
                               config.device, config.dist_backend, config.seed)
        critic.initialize(None, ft)
    # A reward-model pool, when configured: the training workflow scores through it.
    rm = RemoteRewardModelEngine(config.reward_model) if config.reward_model else None
    processor = vision_processor(config.actor.path)  # a vision-language model's workflow needs it
    extra = {"processor": processor} if processor is not None else {}
    rm_kw = {"reward_model": rm} if rm is not None else {}
    workflow = build_workflow(config.workflow, config.gconfig, tokenizer, **extra, **rm_kw)
    eval_gconfig = config.eval_gconfig or config.gconfig.new(n_samples=1, greedy=True, temperature=0.0)
    # evaluation keeps the rule reward alone: held-out accuracy stays the verifiable one
    eval_workflow = build_workflow(config.workflow, eval_gconfig, tokenizer, **extra)
    eval_fn = load_eval_fn(config.evaluator.eval_fn)

    def run_eval(version: int) -> dict[str, float]:  # drains the training rollout first
        return run_evaluation(rollout, eval_rollout, eval_workflow, valid_rows, config.evaluator,
                              eval_fn, {"tokenizer": tokenizer, "version": version, "config": config}, rank == 0)

    # Weight updates: the run's one transport (a disk folder per version, one broadcast group
    # for the whole run, ...), chosen from the config and the backend. Whether the servers run
    # on GPUs comes from the config alone: this process's CUDA_VISIBLE_DEVICES names the trainer's.
    on_gpu = not on_cpu(config.sglang.device, config.launcher.gpus_per_server, {})
    pushes = WeightPushPlan.choose(config.weight_update, config.actor.lora is not None, protocol,
                                   on_gpu, config.run_dir("weights"), rank)

    # Recovery: weights, optimizer, data position (the loader's, plus the epoch and, in async
    # mode, the rows in flight: the loader is past them), version and staleness counters.
    cycle = DataCycle()  # sync mode's walk over the loader; async mode's is the executor's
    data_state = rollout.data_state if config.async_training else cycle.state_dict
    load_data_state = rollout.load_data_state if config.async_training else cycle.load_state_dict
    saver, evaluator = FreqController.from_config(config.saver), FreqController.from_config(config.evaluator)
    checkpointer = FreqController.from_config(config.recover)
    start_step, version = 0, 0
    info = rec.load_recover_info(rec.find_latest(rec.recover_root(config))) if rec.should_recover(config) else None
    if info is not None:
        ckpt = rec.find_latest(rec.recover_root(config))
        actor.load(SaveLoadMeta(str(rec.weights_dir(ckpt)), "dcp", with_optim=True))
        loader.load_state_dict(info.dataloader_state)
        load_data_state(info.extra.get("data", {}))
        for ctl, state in ((saver, info.saver_state), (evaluator, info.evaluator_state), (checkpointer, info.checkpointer_state)):
            ctl.load_state_dict(state)
        start_step, version = info.step + 1, info.version
        rollout.restore(version)
    rollout.initialize(None, train_data_parallel_size=world)
    eval_rollout.initialize(None, train_data_parallel_size=1)
    if rm is not None:
        rm.initialize()
    if info is not None:  # servers may hold other weights after a crash
        push_weights(actor, rollout, pushes.meta(version, actor),
                     rank, pushes.wu.timeout, pushes.wu.retries)

    # Steps are logged as step + 1: a resumed run keeps the lines up to its checkpoint's.
    logger = StatsLogger(config.stats_logger, config.run_dir("logs"), total_steps=total_steps,
                         start_step=start_step if info else None)
    ids_log = SampleIdLog(config.run_dir("logs"), start_step if info else None, rank)
    observers = StepObservers(config, rank, rollout, actor, config.run_dir("logs"))  # /metrics, trace
    if valid_rows and info is None:
        logger.commit(0, run_eval(version))
    # Training time only (evaluations excluded), carried over a restart for total_train_seconds.
    clock = TrainClock(info.extra.get("train_seconds", 0.0) if info else 0.0)
    # DAPO dynamic sampling: groups with equal rewards are dropped, more are drawn
    keep = GroupRewardFilter() if config.actor.dynamic_sampling else None
    # launcher.colocate: servers and trainer take turns with the host's memory (sync mode)
    # the reward-model pool takes turns too, unless the launcher gave it GPUs of its own
    own_gpus = config.launcher.reward_model_servers is not None and config.launcher.gpus_per_server
    phases = ColocatedPhases(
        rollout, actor, ref, rank, reward_model=None if own_gpus else rm,
        recreate=config.launcher.colocate_servers == "recreate",
        start_timeout=config.launcher.startup_timeout + 60) if config.launcher.colocate else None
    rollout.idle_stats()  # rollout/idle_ratio (no episode in flight): the first window opens here
    # timeperf/step runs from the end of the previous step (its logging and checkpoint
    # included) to this step's commit, evaluation excluded: the steps' sum is the loop's time.
    t0 = time.perf_counter()
    for step in range(start_step, total_steps):
        epoch = step // ft.steps_per_epoch
        if phases is not None:  # co-located: the accelerator goes to the servers
            phases.offload_actor()
        with timer("rollout_wait"):
            if config.async_training:
                batch = rollout.prepare_batch(loader, workflow, should_accept=keep)
            elif keep is not None:
                batch = rollout_full_batch(
                    lambda rows, accept: rollout.rollout_batch(rows, workflow, accept),
                    lambda: cycle.next_rows(loader), keep,
                    config.rollout.consumer_batch_size, config.actor.group_size)
            else:
                batch = rollout.rollout_batch(cycle.next_rows(loader), workflow)
        if phases is not None:  # ... and back to the trainer
            phases.release()
        with timer("logp"):
            actor.prepare_prox_logp(batch)  # fused into the update when it can be
            if ref is not None:
                batch["ref_logp"] = (phases.ref_logp(batch) if phases is not None
                                     else ref.compute_logp(batch))
            if critic is not None:
                batch["values"] = critic.compute_values(batch)
            actor.compute_advantages(batch)
        with timer("update"):
            stats = actor.ppo_update(batch)
            if critic is not None:
                stats.update(critic.ppo_update(batch))
        with timer("weight_sync"):
            if phases is not None:
                phases.resume()
            rollout.pause()
            version = step + 1
            push_weights(actor, rollout, pushes.meta(version, actor),
                         rank, pushes.wu.timeout, pushes.wu.retries)
            rollout.resume()

        epoch_done = int((step + 1) % ft.steps_per_epoch == 0)
        out_of_time = bool(config.total_train_seconds) and rank0_decides(clock.elapsed() >= config.total_train_seconds)
        last = step + 1 == total_steps or out_of_time
        if saver.check(epochs=epoch_done, steps=1) or last:
            actor.save(SaveLoadMeta(str(config.run_dir("checkpoints", f"step{step + 1}")), "hf",
                                    tokenizer=tokenizer, processor=processor))
        stats.update(rollout.idle_stats())
        eval_secs = 0.0
        if keep is not None:
            stats.update(keep.stats())
        if valid_rows and rank0_decides(evaluator.check(steps=1) or last):
            with clock.paused():
                te = time.perf_counter()
                stats.update(run_eval(version))
                eval_secs = time.perf_counter() - te
        stats["timeperf/train_elapsed"] = clock.elapsed()
        stats.update(stats_tracker.export())
        stats.update(batch_rollout_stats(batch, rollout, version, time.perf_counter() - t0 - eval_secs))
        ids_log.record(step + 1, batch.get("sample_ids"))
        logger.commit(step + 1, stats)
        observers.step(step + 1, version, t0, stats, eval_secs)
        # Last, after the step's logs: a crash before it repeats the step, never skips its lines.
        if checkpointer.check(epochs=epoch_done, steps=1):
            info = rec.RecoverInfo(step=step, epoch=epoch, epoch_step=step % ft.steps_per_epoch, version=version,
                                   dataloader_state=loader.state_dict(), saver_state=saver.state_dict(),
                                   evaluator_state=evaluator.state_dict(), checkpointer_state=checkpointer.state_dict(),
                                   extra={"data": data_state(), "train_seconds": clock.elapsed()})
            rec.save_checkpoint(rec.recover_root(config), info, lambda d: actor.save(SaveLoadMeta(str(d), "dcp", with_optim=True)))
        t0 = time.perf_counter()
        if out_of_time:
            break

    logger.close()
    observers.close()
    for engine in (rollout, eval_rollout, actor, *(e for e in (rm, critic) if e is not None)):
        engine.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
