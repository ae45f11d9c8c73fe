"""The least a launch's pre-launch check accepts, in a temp dir: a model folder (its
``config.json`` only: the check reads no weights, and nothing is started) and the toy task's
files, as overrides that point a shipped config there (fileroot included, so a dry run never
looks at the repository's own ``outputs/``)."""

from __future__ import annotations

import json
from pathlib import Path

from arealite.demo.toy_math import write_toy_math


def min_model(folder: Path, context: int = 512) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(
        {"model_type": "qwen2", "max_position_embeddings": context}))
    return folder


def min_assets(root: Path, model_key: str = "actor.path") -> list[str]:
    """Overrides: ``model_key`` at a config-only model, the toy task's train/valid files, and
    ``cluster.fileroot`` under ``root``."""
    model = min_model(root / "model")
    data = root / "data"
    if not (data / "valid.jsonl").is_file():
        write_toy_math(data, n_train=8, n_valid=4, seed=0)
    return [f"{model_key}={model}", f"train_dataset.path={data / 'train.jsonl'}",
            f"valid_dataset.path={data / 'valid.jsonl'}", f"cluster.fileroot={root / 'out'}"]
