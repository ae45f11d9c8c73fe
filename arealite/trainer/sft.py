"""Supervised fine-tuning entry script: ``torchrun -m arealite.trainer.sft CONFIG [k=v ...]``.

Trains on (prompt, completion) rows with the completion-token NLL, evaluates held-out loss and
greedy exact-match accuracy before the first step (logged as step 0) and then every
``evaluator`` period (teacher forced: the greedy completion equals the reference iff the argmax
at every completion position is the reference token), and saves an HF model. With
``stop_at_valid_accuracy`` it stops as soon as held-out accuracy reaches that value: the main job
uses this to warm-start a policy that is good at the format but far from solving the task.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from arealite.api.config.experiment import SFTConfig
from arealite.api.io_struct import SaveLoadMeta
from arealite.engine.sft.lm_engine import FSDPLMEngine, build_sft_batch
from arealite.engine.sft.vision_batch import RowEncodings, build_vision_sft_batch
from arealite.engine.vision_processor import vision_processor
from arealite.observe import stats_tracker
from arealite.observe.stats_logger import StatsLogger
from arealite.observe.timing import FreqController
from arealite.trainer.offline_setup import start_offline_run


def to_batch(config: SFTConfig, tokenizer: Any, rows: list[dict],
             kept: RowEncodings | None = None) -> dict[str, torch.Tensor]:
    if hasattr(tokenizer, "image_processor"):  # a vision-language model's processor: rows have images
        return build_vision_sft_batch(tokenizer, [str(r[config.prompt_key]) for r in rows],
                                      [r["images"] for r in rows],
                                      [str(r[config.completion_key]) for r in rows], kept)
    return build_sft_batch(
        tokenizer,
        [str(r[config.prompt_key]) for r in rows],
        [str(r[config.completion_key]) for r in rows],
        use_chat_template=config.use_chat_template,
    )


def evaluate(engine: FSDPLMEngine, data: dict[str, torch.Tensor]) -> dict:
    """Held-out loss and exact-match accuracy of the held-out batch ``data``, over all ranks
    (every rank sees every row)."""
    loss, exact = engine.evaluate_lm_exact(data)
    return {"valid/loss": loss, "valid/accuracy": exact}


def main(argv: list[str] | None = None) -> int:
    run = start_offline_run(argv, SFTConfig)
    config: SFTConfig = run.config
    rank, tokenizer, loader, ft, total = run.rank, run.tokenizer, run.loader, run.ft, run.total_steps
    valid_rows = run.valid_rows
    processor = vision_processor(config.model.path)  # a vision-language model's batches need it

    engine = FSDPLMEngine(config.model, config.device, config.dist_backend, config.seed)
    engine.initialize(None, ft)
    out_dir = config.output_dir or str(config.run_dir("model"))
    logger = StatsLogger(config.stats_logger, config.run_dir("logs"), total_steps=total)
    eval_ctl = FreqController.from_config(config.evaluator)
    step, reached = 0, False
    # the held-out rows are one batch, built once; training rows are encoded once (vision rows'
    # encodings kept for the next epochs: RowEncodings)
    valid = to_batch(config, processor or tokenizer, valid_rows) if valid_rows else None
    kept = RowEncodings() if processor is not None else None
    if valid is not None:  # the starting point: where held-out accuracy rises from
        logger.commit(0, evaluate(engine, valid))
    for epoch in range(config.total_train_epochs):
        loader.sampler.set_epoch(epoch)
        for rows in loader:
            stats = engine.train_lm(to_batch(config, processor or tokenizer, rows, kept))
            step += 1
            last = step >= total
            if valid is not None and (eval_ctl.check(epochs=0, steps=1) or last):
                stats.update(evaluate(engine, valid))
                target = config.stop_at_valid_accuracy
                reached = target is not None and stats["valid/accuracy"] >= target
            stats.update(stats_tracker.export())
            logger.commit(step, stats)
            if last or reached:
                break
        if step >= total or reached:
            break
    # servers and workflows load the processor from the model dir
    engine.save(SaveLoadMeta(out_dir, "hf", tokenizer=tokenizer, processor=processor))
    if rank == 0:
        print(f"SFT done after {step} steps; model saved to {out_dir}", flush=True)
    logger.close()
    engine.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
