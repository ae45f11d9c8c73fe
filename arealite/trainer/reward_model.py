"""Reward-model training: ``torchrun -m arealite.trainer.reward_model CONFIG [k=v ...]``.

Rows ``{prompt, chosen, rejected}`` (the same files as DPO: ``toy_math.write_toy_preferences``
builds them for the toy task) train a one-label sequence classifier, started from
``model.path``, with the Bradley–Terry loss (``arealite.engine.preference.reward_model``).
Held-out loss and pair accuracy are logged as ``valid/*``; the final model is saved in HF format
(architecture ``*ForSequenceClassification``), which ``python -m servers.launch_server
--is-embedding`` and SGLang serve on ``/classify``.
"""

from __future__ import annotations

import sys

from arealite.api.config.experiment import RewardModelConfig
from arealite.api.io_struct import SaveLoadMeta
from arealite.engine.preference.batch import dpo_batch
from arealite.engine.preference.reward_model import RewardModelActor, RewardModelEngine
from arealite.observe import stats_tracker
from arealite.observe.stats_logger import StatsLogger
from arealite.observe.timing import FreqController
from arealite.trainer.offline_setup import start_offline_run


def main(argv: list[str] | None = None) -> int:
    run = start_offline_run(argv, RewardModelConfig)
    config: RewardModelConfig = run.config
    tokenizer, valid_rows, total = run.tokenizer, run.valid_rows, run.total_steps

    def batch(rows: list[dict]):
        return dpo_batch(tokenizer, rows, config.prompt_key, config.chosen_key,
                         config.rejected_key, config.use_chat_template)

    engine = RewardModelEngine(config.model, config.device, config.dist_backend, config.seed)
    engine.initialize(None, run.ft)
    actor = RewardModelActor(engine, config.center_coef)
    out_dir = config.output_dir or str(config.run_dir("model"))
    logger = StatsLogger(config.stats_logger, config.run_dir("logs"), total_steps=total)
    eval_ctl = FreqController.from_config(config.evaluator)
    valid = batch(valid_rows) if valid_rows else None

    def evaluate() -> dict[str, float]:
        return {f"valid/{k}": v for k, v in actor.evaluate(valid).items()}

    if valid is not None:
        logger.commit(0, evaluate())
    step = 0
    for epoch in range(config.total_train_epochs):
        run.loader.sampler.set_epoch(epoch)
        for rows in run.loader:
            stats = actor.train_step(batch(rows))
            step += 1
            if valid is not None and (eval_ctl.check(epochs=0, steps=1) or step >= total):
                stats.update(evaluate())
            stats.update(stats_tracker.export())
            logger.commit(step, stats)
            if step >= total:
                break
        if step >= total:
            break
    engine.save(SaveLoadMeta(out_dir, "hf", tokenizer=tokenizer))
    if run.rank == 0:
        print(f"reward model done after {step} steps; saved to {out_dir}", flush=True)
    logger.close()
    engine.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
