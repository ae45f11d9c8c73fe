"""The ``train_dataset`` and ``valid_dataset`` sections: which rows a trainer reads."""

from __future__ import annotations

from pydantic import Field

from arealite.api.config.base import BaseConfig


class DatasetConfig(BaseConfig):
    path: str = Field("", description="Local JSON/JSONL/CSV file, or an HF datasets name.")
    name: str | None = Field(None, description="HF datasets config name.")
    split: str = Field("train", description="Split to load.")
    batch_size: int = Field(1, ge=1, description="Prompts per batch.")
    shuffle: bool = Field(True, description="Shuffle each epoch (seeded).")
    num_workers: int = Field(0, ge=0, description="DataLoader worker processes.")
    drop_last: bool = Field(True, description="Drop the last incomplete batch.")
    max_length: int | None = Field(None, ge=1, description="Drop prompts longer than this.")
