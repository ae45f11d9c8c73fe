"""The offline preference experiment (``kind: dpo``): DPO, IPO or KTO from a reference model.

Kept beside ``config.py`` (which is near its size limit); the experiment kinds are registered
in ``arealite.api.config_loader.CONFIG_CLASSES``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from arealite.api.config import BaseExperimentConfig, LauncherConfig, TrainEngineConfig


class DPOConfig(BaseExperimentConfig):
    """Rows ``{prompt, chosen, rejected}`` (DPO, IPO) or ``{prompt, completion, label}`` (KTO)
    from JSON/JSONL files; the reference is the initial ``model`` (frozen copy)."""

    kind: Literal["dpo"] = Field("dpo", description="Which experiment this file configures.")
    model: TrainEngineConfig = Field(
        default_factory=TrainEngineConfig, description="The policy (its start is the reference).")
    loss_type: Literal["sigmoid", "ipo", "kto"] = Field(
        "sigmoid", description="DPO (sigmoid), IPO or KTO; formulas in docs/algorithms.md.")
    beta: float = Field(0.1, gt=0, description="Strength of the pull towards the reference.")
    sft_weight: float = Field(
        0.0, ge=0, description="DPO/IPO: weight of the chosen answers' token-mean NLL added to "
        "the loss (RPO); 0 is plain DPO.")
    desirable_weight: float = Field(1.0, gt=0, description="KTO weight of desirable rows.")
    undesirable_weight: float = Field(1.0, gt=0, description="KTO weight of undesirable rows.")
    prompt_key: str = Field("prompt", description="Row field holding the prompt.")
    chosen_key: str = Field("chosen", description="Row field of the preferred completion.")
    rejected_key: str = Field("rejected", description="Row field of the dispreferred completion.")
    completion_key: str = Field("completion", description="KTO: row field of the completion.")
    label_key: str = Field("label", description="KTO: row field, true when desirable.")
    use_chat_template: bool = Field(True, description="Wrap prompts as a chat user turn.")
    output_dir: str = Field("", description="Final HF model directory; empty: under fileroot.")
    launcher: LauncherConfig = Field(
        default_factory=LauncherConfig, description="Trainer processes (servers are not used).")


class RewardModelConfig(BaseExperimentConfig):
    """A reward model (``kind: reward_model``) from ``{prompt, chosen, rejected}`` rows with the
    Bradley–Terry loss; ``model.path`` is a causal LM (its backbone is kept, a one-output
    ``score`` head is added) or a sequence classifier to train further."""

    kind: Literal["reward_model"] = Field(
        "reward_model", description="Which experiment this file configures.")
    model: TrainEngineConfig = Field(
        default_factory=TrainEngineConfig, description="The reward model and its optimizer.")
    center_coef: float = Field(
        0.0, ge=0, description="Weight of (r_chosen + r_rejected)^2, keeping scores near 0.")
    prompt_key: str = Field("prompt", description="Row field holding the prompt.")
    chosen_key: str = Field("chosen", description="Row field of the preferred completion.")
    rejected_key: str = Field("rejected", description="Row field of the dispreferred completion.")
    use_chat_template: bool = Field(True, description="Wrap prompts as a chat user turn.")
    output_dir: str = Field("", description="Final HF model directory; empty: under fileroot.")
    launcher: LauncherConfig = Field(
        default_factory=LauncherConfig, description="Trainer processes (servers are not used).")
