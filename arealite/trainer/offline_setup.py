"""The start every offline trainer (SFT, DPO) shares: config, logging, seed, tokenizer, rows,
the rank's dataloader and the step count."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from arealite.api.config.experiment import BaseExperimentConfig
from arealite.api.io_struct import FinetuneSpec
from arealite.dataset.loader import create_dataloader, load_rows
from arealite.trainer.common import config_from_argv, dist_info, load_tokenizer, setup_logging


@dataclass
class OfflineRun:
    config: Any
    rank: int
    tokenizer: Any
    train_rows: list[dict]
    valid_rows: list[dict]
    loader: Any
    ft: FinetuneSpec
    total_steps: int


def start_offline_run(argv: list[str] | None, cls: type[BaseExperimentConfig]) -> OfflineRun:
    """Parse ``argv`` as ``cls`` (exit 2 on a config error) and load what training needs;
    ``config.model`` is the trained model (its path is the default tokenizer)."""
    config = config_from_argv(argv, cls)
    rank, world = dist_info()
    setup_logging(rank)
    torch.manual_seed(config.seed)
    tokenizer = load_tokenizer(config.tokenizer_path or config.model.path)
    train_rows = load_rows(config.train_dataset)
    valid_rows = load_rows(config.valid_dataset) if config.valid_dataset else []
    loader = create_dataloader(train_rows, config.train_dataset, config.seed, rank, world)
    # the total_train_steps cap is where the run, and so its lr schedule, ends (as in RL runs)
    ft = FinetuneSpec(config.total_train_epochs, len(train_rows), config.train_dataset.batch_size,
                      config.total_train_steps)
    total = ft.total_train_steps
    return OfflineRun(config, rank, tokenizer, train_rows, valid_rows, loader, ft, total)
