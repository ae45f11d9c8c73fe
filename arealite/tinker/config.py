"""The Tinker service's config (``arealite tinker-server CONFIG [key=value ...]``): where it
listens, the local model it trains, the server pool it samples from and how weights get there.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from arealite.api.config.actor import TrainEngineConfig
from arealite.api.config.base import BaseConfig
from arealite.api.config.rollout import InferenceEngineConfig
from arealite.api.config.weights import WeightUpdateConfig

API_KEY_ENV = "AREALITE_TINKER_API_KEY"


class TinkerServerConfig(BaseConfig):
    host: str = Field("127.0.0.1", description="Address the service listens on.")
    port: int = Field(0, ge=0, le=65535, description="Port; 0 picks a free one (printed).")
    api_key: str | None = Field(
        None, description=f"Key clients must send (the SDK's TINKER_API_KEY, which must start "
        f"with 'tml-'); else {API_KEY_ENV}; neither: no key is checked.")
    fileroot: str = Field("outputs/tinker", description="Checkpoints and pushed weights.")
    base_model: str = Field(
        "", description="The name clients use for the model; empty: model.path. The SDK loads "
        "its tokenizer by this name, so a local path lets it load offline.")
    max_context_length: int = Field(2048, ge=1, description="Advertised in the capabilities.")
    model: TrainEngineConfig = Field(
        default_factory=TrainEngineConfig,
        description="The trainer engine (path, dtype, micro-batch budget); LoRA rank and the "
        "optimizer's settings come from each request.")
    lora_alpha: float | None = Field(
        None, gt=0, description="LoRA alpha of created adapters; None: 2 x rank.")
    device: str = Field("cpu", description="Trainer device: cpu or cuda.")
    dist_backend: str = Field("gloo", description="Trainer process group backend.")
    seed: int = Field(1, description="Seed of the trainer (LoRA initialisation).")
    rollout: InferenceEngineConfig = Field(
        default_factory=InferenceEngineConfig,
        description="The server pool (server_addrs, keys, timeouts).")
    keep_versions: int = Field(
        1 << 20, ge=1, description="Older LoRA versions of a model kept loaded on the servers "
        "for the sampling clients created on them (a sampling client of an unloaded version "
        "gets an error; each is a small adapter).")
    weight_update: WeightUpdateConfig = Field(
        default_factory=WeightUpdateConfig, description="How weights reach the servers.")
    retrieve_wait: float = Field(
        40.0, gt=0, description="Seconds a retrieve_future call waits for its result before "
        "answering try_again (long polling; the SDK allows 45).")

    def root(self) -> Path:
        return Path(self.fileroot).resolve()

    def model_name(self) -> str:
        return self.base_model or self.model.path
