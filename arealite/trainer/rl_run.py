"""The bookkeeping of one RL run (``trainer/grpo.py``): recover or start, and what follows each
step (HF checkpoint, evaluation, logs, recovery checkpoint).

Recovery restores every field a recovery checkpoint holds (``RecoverInfo``): the actor's
weights and optimizer, the loader's position plus the data state beyond it (the epoch and, in
async mode, the rows in flight), the save / evaluate / checkpoint schedules, the version (with
the staleness counters it implies) and the training seconds already spent (for
``total_train_seconds``); then the servers get the checkpoint's weights, since they may hold
others after a crash. Steps are logged as ``step + 1``: a resumed run keeps the lines up to its
checkpoint's.

Every decision taken from a clock is rank 0's (``rank0_decides``), so all ranks run the same
collectives in the same order: the time budget, the HF save, the evaluation (only with
held-out rows), the sample-id log, the recovery checkpoint.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from arealite.api.config.experiment import GRPOConfig
from arealite.api.io_struct import SaveLoadMeta
from arealite.observe import stats_tracker
from arealite.observe.observers import StepObservers
from arealite.observe.rollout_stats import batch_rollout_stats
from arealite.observe.sample_log import SampleIdLog
from arealite.observe.sample_view import format_samples
from arealite.observe.stats_logger import StatsLogger
from arealite.observe.timing import FreqController
from arealite.trainer.eval_hook import TrainClock
from arealite.trainer.rl_engines import RLEngines, check_consistency, push_to_servers
from arealite.utils import recover as rec
from arealite.utils.distributed import rank0_decides


@dataclass
class RLRun:
    config: GRPOConfig
    start_step: int
    saver: FreqController
    evaluator: FreqController
    checkpointer: FreqController
    logger: StatsLogger
    ids_log: SampleIdLog
    observers: StepObservers  # /metrics, trace
    clock: TrainClock  # training time only (evaluations excluded), carried over a restart
    # timeperf/step runs from the end of the previous step (its logging and checkpoint
    # included) to this step's commit, evaluation excluded: the steps' sum is the loop's time
    t0: float

    def after_step(self, e: RLEngines, step: int, batch: dict[str, Any],
                   stats: dict[str, float]) -> bool:
        """Save, evaluate, log, then the recovery checkpoint; True when the time budget is
        used up (the run ends after this step)."""
        config, version = self.config, step + 1
        epoch_done = int((step + 1) % e.ft.steps_per_epoch == 0)
        out_of_time = bool(config.total_train_seconds) and rank0_decides(
            self.clock.elapsed() >= config.total_train_seconds)
        last = step + 1 == e.total_steps or out_of_time
        if self.saver.check(epochs=epoch_done, steps=1) or last:
            e.actor.save(SaveLoadMeta(str(config.run_dir("checkpoints", f"step{step + 1}")), "hf",
                                      tokenizer=e.tokenizer, processor=e.processor))
        stats.update(e.rollout.idle_stats())
        eval_secs = 0.0
        if e.keep is not None:
            stats.update(e.keep.stats())
        if e.valid_rows and rank0_decides(self.evaluator.check(steps=1) or last):
            with self.clock.paused():
                te = time.perf_counter()
                stats.update(e.evaluate(version))
                eval_secs = time.perf_counter() - te
        stats["timeperf/train_elapsed"] = self.clock.elapsed()
        stats.update(stats_tracker.export())
        stats.update(batch_rollout_stats(batch, e.rollout, version, time.perf_counter() - self.t0 - eval_secs))
        # the ledger line: rows, episodes and drops of this step (before its checkpoint)
        self.ids_log.record(step + 1, batch.get("sample_ids"), batch, e.rollout.take_dropped(),
                            version, None if e.config.async_training else e.cycle.epoch)
        self.logger.commit(step + 1, stats)
        every = config.stats_logger.samples_every
        if every and ((step + 1) % every == 0 or step == 0):  # on by default: see the replies
            self.logger.say(format_samples(batch, e.tokenizer, step + 1,
                                           config.stats_logger.samples_shown))
        self.observers.step(step + 1, version, self.t0, stats, eval_secs)
        # Last, after the step's logs: a crash before it repeats the step, never skips its lines.
        if self.checkpointer.check(epochs=epoch_done, steps=1):
            self.save_recover_checkpoint(e, step, version)
        self.t0 = time.perf_counter()
        return out_of_time

    def save_recover_checkpoint(self, e: RLEngines, step: int, version: int) -> None:
        spe = e.ft.steps_per_epoch
        info = rec.RecoverInfo(step=step, epoch=step // spe, epoch_step=step % spe, version=version,
                               dataloader_state=e.loader.state_dict(), saver_state=self.saver.state_dict(),
                               evaluator_state=self.evaluator.state_dict(),
                               checkpointer_state=self.checkpointer.state_dict(),
                               extra={"data": e.data_state(), "train_seconds": self.clock.elapsed()})
        rec.save_checkpoint(rec.recover_root(self.config), info,
                            lambda d: e.actor.save(SaveLoadMeta(str(d), "dcp", with_optim=True)))

    def close(self, e: RLEngines | None = None) -> None:
        if e is not None:  # the ledger's end: rows drawn and still in flight
            self.ids_log.record_end(e.rollout.inflight_tagged() if e.config.async_training else [])
        self.logger.close()
        self.observers.close()


def recover_or_start(config: GRPOConfig, e: RLEngines) -> RLRun:
    """The run from its newest recovery checkpoint (``recover.mode``), or from step 0 after an
    evaluation of the initial weights; the clients started either way."""
    saver, evaluator = FreqController.from_config(config.saver), FreqController.from_config(config.evaluator)
    checkpointer = FreqController.from_config(config.recover)
    start_step, version = 0, 0
    info = rec.load_recover_info(rec.find_latest(rec.recover_root(config))) if rec.should_recover(config) else None
    if info is not None:
        ckpt = rec.find_latest(rec.recover_root(config))
        e.actor.load(SaveLoadMeta(str(rec.weights_dir(ckpt)), "dcp", with_optim=True))
        e.loader.load_state_dict(info.dataloader_state)
        e.load_data_state(info.extra.get("data", {}))
        for ctl, state in ((saver, info.saver_state), (evaluator, info.evaluator_state),
                           (checkpointer, info.checkpointer_state)):
            ctl.load_state_dict(state)
        start_step, version = info.step + 1, info.version
        e.rollout.restore(version)
    e.start()
    if info is not None:  # servers may hold other weights after a crash
        push_to_servers(e, version)
    if e.gate is not None:  # step 0 (or the restart): what the servers sample from now
        check_consistency(e, version)
    kept = start_step if info else None  # the last logged step kept from the earlier run
    logger = StatsLogger(config.stats_logger, config.run_dir("logs"), total_steps=e.total_steps,
                         start_step=kept)
    ids_log = SampleIdLog(config.run_dir("logs"), kept, e.rank)
    observers = StepObservers(config, e.rank, e.rollout, e.actor, config.run_dir("logs"))
    if e.valid_rows and info is None:
        logger.commit(0, e.evaluate(version))
    clock = TrainClock(info.extra.get("train_seconds", 0.0) if info else 0.0)
    e.rollout.idle_stats()  # rollout/idle_ratio (no episode in flight): the first window opens here
    return RLRun(config, start_step, saver, evaluator, checkpointer, logger, ids_log, observers,
                 clock, t0=time.perf_counter())
