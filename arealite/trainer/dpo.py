"""Offline preference training: ``torchrun -m arealite.trainer.dpo CONFIG [k=v ...]``.

DPO / IPO (rows ``{prompt, chosen, rejected}``) or KTO (rows ``{prompt, completion, label}``)
from JSON/JSONL files, starting from ``model.path``, which also serves as the frozen reference.
Each step: reference and policy sequence log-probabilities, then one update of the preference
loss (``arealite.engine.preference``). Held-out loss and reward statistics are logged as
``valid/*``; the final model is saved in HF format.
"""

from __future__ import annotations

import sys
from typing import Any

from arealite.api.config.experiment import DPOConfig
from arealite.api.io_struct import SaveLoadMeta
from arealite.engine.fsdp_engine import FSDPEngine
from arealite.engine.preference.actor import PreferenceActor
from arealite.engine.preference.batch import dpo_batch, kto_batches
from arealite.observe import stats_tracker
from arealite.observe.stats_logger import StatsLogger
from arealite.observe.timing import FreqController
from arealite.trainer.offline_setup import start_offline_run


def run_batch(actor: PreferenceActor, c: DPOConfig, tokenizer: Any, rows: list[dict],
              train: bool) -> dict[str, float]:
    """One update (``train``) or one held-out evaluation on ``rows``."""
    if c.loss_type == "kto":
        data, mismatched = kto_batches(tokenizer, rows, c.prompt_key, c.completion_key,
                                       c.label_key, c.use_chat_template)
        w = (c.desirable_weight, c.undesirable_weight)
        if train:
            return actor.kto_step(data, mismatched, *w)
        return actor.evaluate(data, "kto", mismatched, *w)
    data = dpo_batch(tokenizer, rows, c.prompt_key, c.chosen_key, c.rejected_key,
                     c.use_chat_template)
    return actor.dpo_step(data, c.loss_type) if train else actor.evaluate(data, c.loss_type)


def main(argv: list[str] | None = None) -> int:
    run = start_offline_run(argv, DPOConfig)
    config: DPOConfig = run.config
    rank, tokenizer, loader, ft, total = run.rank, run.tokenizer, run.loader, run.ft, run.total_steps
    valid_rows = run.valid_rows

    engine = FSDPEngine(config.model, config.device, config.dist_backend, config.seed)
    engine.initialize(None, ft)
    ref = FSDPEngine(config.model.model_copy(update={"optimizer": None}), config.device,
                     config.dist_backend, config.seed)
    ref.initialize(None, ft)
    actor = PreferenceActor(engine, ref, config.beta, config.sft_weight)
    out_dir = config.output_dir or str(config.run_dir("model"))
    logger = StatsLogger(config.stats_logger, config.run_dir("logs"), total_steps=total)
    eval_ctl = FreqController.from_config(config.evaluator)

    def evaluate() -> dict[str, float]:
        return {f"valid/{k}": v for k, v in
                run_batch(actor, config, tokenizer, valid_rows, train=False).items()}

    if valid_rows:
        logger.commit(0, evaluate())
    step = 0
    for epoch in range(config.total_train_epochs):
        loader.sampler.set_epoch(epoch)
        for rows in loader:
            stats = run_batch(actor, config, tokenizer, rows, train=True)
            step += 1
            if valid_rows and (eval_ctl.check(epochs=0, steps=1) or step >= total):
                stats.update(evaluate())
            stats.update(stats_tracker.export())
            logger.commit(step, stats)
            if step >= total:
                break
        if step >= total:
            break
    engine.save(SaveLoadMeta(out_dir, "hf", tokenizer=tokenizer))
    if rank == 0:
        print(f"{config.loss_type} done after {step} steps; model saved to {out_dir}", flush=True)
    logger.close()
    ref.destroy()
    engine.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
