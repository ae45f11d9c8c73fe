"""Small pieces every entry script needs: config from argv, rank info, tokenizer, logging."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from arealite.api.config.experiment import BaseExperimentConfig
from arealite.api.config.loader import ConfigError, load_config

logger = logging.getLogger("arealite.trainer.common")


def config_from_argv(argv: list[str] | None, cls: type[BaseExperimentConfig]) -> Any:
    """``CONFIG.yaml key=value ...`` -> a validated config; a config error exits with status 2.
    Run as a script (``argv`` None: torchrun, a launcher), the run folder is checked as a
    launcher checks it (``run_folder.claim_by_hand``): a second run by hand into a trial that
    holds one is refused with one line and status 2 instead of appending to it."""
    from_script = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    path = argv.pop(0) if argv and "=" not in argv[0] else None
    try:
        config = load_config(path, argv, cls)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if from_script:
        from arealite.launcher.plan import LaunchError
        from arealite.launcher.run_folder import claim_by_hand

        try:
            claim_by_hand(config)
        except LaunchError as e:
            if dist_info()[0] == 0:  # one line, not one per rank
                print(f"arealite: launch error: {e}", file=sys.stderr)
            raise SystemExit(2) from None
    return config


def dist_info() -> tuple[int, int]:
    """(rank, world size) from torchrun's environment; (0, 1) when run directly."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def setup_logging(rank: int) -> None:
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"%(asctime)s [r{rank}] %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    for noisy in ("httpx", "urllib3", "transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
