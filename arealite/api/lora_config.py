"""LoRA adapter settings of a trained model (``TrainEngineConfig.lora``).

With ``lora`` set the base weights stay frozen: only the adapter matrices get gradients and
optimizer state, checkpoints and weight pushes carry only the adapter (peft's on-disk format:
``adapter_config.json`` + ``adapter_model.safetensors``), and the servers run the adapter on top
of their unchanged base model (SGLang's ``/load_lora_adapter``, ``lora_path`` per request).
"""

from __future__ import annotations

from pydantic import Field, field_validator

from arealite.api.config_base import BaseConfig


class LoRAConfig(BaseConfig):
    """A LoRA adapter (peft ``LoraConfig``) over the model's linear layers."""

    rank: int = Field(8, ge=1, description="Adapter rank r (inner dimension of A and B).")
    alpha: float = Field(
        16.0, gt=0.0, description="Scaling numerator: the adapter's output is multiplied by "
        "alpha / rank.")
    dropout: float = Field(
        0.0, ge=0.0, lt=1.0, description="Dropout on the adapter's input while training (the "
        "servers run without it).")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                 "up_proj", "down_proj"],
        description="Names (last component) of the linear layers that get an adapter. Only "
        "linear layers inside the decoder blocks: the embeddings and lm_head stay frozen.")
    init_lora_weights: bool = Field(
        True, description="peft's initialisation: B = 0, so the adapted model starts equal to "
        "the base model; false draws B at random too (tests).")

    @field_validator("target_modules")
    @classmethod
    def _targets(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("target_modules must name at least one linear layer")
        bad = [m for m in v if m in ("lm_head", "embed_tokens")]
        if bad:
            raise ValueError(f"target_modules: {bad} cannot take a LoRA adapter here (only "
                             "the linear layers of the decoder blocks)")
        return v
