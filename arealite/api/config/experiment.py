"""The experiment kinds (``kind:`` in a YAML file: ``grpo``, ``sft``, ``dpo``,
``reward_model``), each a whole config tree: the top-level scalars (names, seed, run length,
device) and one field per section, whose model lives in the module named for it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from arealite.api.config.actor import PPOActorConfig, PPOCriticConfig, TrainEngineConfig
from arealite.api.config.base import BaseConfig
from arealite.api.config.dataset import DatasetConfig
from arealite.api.config.launcher import LauncherConfig, apply_colocate
from arealite.api.config.rollout import GenerationHyperparameters, InferenceEngineConfig
from arealite.api.config.run import (
    ClusterConfig,
    EvaluatorConfig,
    RecoverConfig,
    SaverConfig,
    StatsLoggerConfig,
)
from arealite.api.config.servers import ServersConfig
from arealite.api.config.weights import WeightUpdateConfig
from arealite.api.config.workflow import WorkflowConfig


class BaseExperimentConfig(BaseConfig):
    experiment_name: str = Field("arealite", description="Experiment name (output folder).")
    trial_name: str = Field("trial0", description="Trial name (output sub-folder).")
    seed: int = Field(1, description="Global random seed.")
    total_train_epochs: int = Field(1, ge=1, description="Epochs over the training set.")
    total_train_steps: int | None = Field(None, ge=1, description="Stop after N steps if set.")
    tokenizer_path: str = Field("", description="Tokenizer dir; empty uses the actor's path.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: cuda when present.")
    dist_backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="auto: nccl on cuda, gloo on cpu."
    )
    cluster: ClusterConfig = Field(
        default_factory=ClusterConfig, description="Where the run's files go (fileroot).")
    train_dataset: DatasetConfig = Field(
        default_factory=DatasetConfig, description="The training split.")
    valid_dataset: DatasetConfig | None = Field(None, description="Held-out split, if any.")
    saver: SaverConfig = Field(
        default_factory=SaverConfig, description="When to save HF checkpoints.")
    recover: RecoverConfig = Field(
        default_factory=RecoverConfig, description="Recovery checkpoints (DCP + state) and resume."
    )
    evaluator: EvaluatorConfig = Field(
        default_factory=EvaluatorConfig, description="Held-out evaluation.")
    stats_logger: StatsLoggerConfig = Field(
        default_factory=StatsLoggerConfig, description="Console, JSONL, tensorboard logging.")
    extra_schema: str | None = Field(
        None,
        description="Your entry script's options model, `module:PydanticModel`: the loader "
        "validates `extra` with it (unknown keys and bad values are config errors) and "
        "`config.extra` is then an instance of it.",
    )
    extra: Any = Field(
        default_factory=dict,
        description="Your entry script's own options (a mapping; typed by extra_schema). "
        "Overrides work as for any key: extra.max_eval_rows=50.",
    )

    @field_validator("extra")
    @classmethod
    def _extra_is_mapping(cls, v: Any) -> Any:
        # Any, not a union: a union's errors name its members, and a BaseModel-typed field
        # would serialize the user's model as an empty BaseModel in --dry-run.
        if not isinstance(v, dict | BaseModel):
            raise ValueError("extra must be a mapping of your script's options")
        return v

    def run_dir(self, *parts: str) -> Path:
        """``{cluster.fileroot}/{experiment_name}/{trial_name}/parts...``: the one place that
        says where a run's files (logs, weights, checkpoints, recovery) live."""
        return Path(self.cluster.fileroot, self.experiment_name, self.trial_name, *parts)


class SFTConfig(BaseExperimentConfig):
    kind: Literal["sft"] = Field("sft", description="Which experiment this file configures.")
    model: TrainEngineConfig = Field(
        default_factory=TrainEngineConfig, description="The model trained by SFT.")
    prompt_key: str = Field("question", description="Row field holding the prompt.")
    completion_key: str = Field("answer", description="Row field holding the target completion.")
    use_chat_template: bool = Field(True, description="Wrap prompts as a chat user turn.")
    stop_at_valid_accuracy: float | None = Field(
        None, ge=0.0, le=1.0,
        description="Stop once held-out greedy exact-match accuracy reaches this (warm starts).",
    )
    output_dir: str = Field("", description="Final HF model directory; empty: under fileroot.")
    launcher: LauncherConfig = Field(
        default_factory=LauncherConfig, description="Trainer processes (servers are not used)."
    )



def check_routing_replay(config: Any) -> None:
    """``actor.routing_replay`` asks the servers for routed experts (gconfig and launch flag)
    and needs a mixture-of-experts model: a dense one is refused here, before anything starts
    (when its folder exists; a model built later is checked when the trainer loads it)."""
    cfg = Path(config.actor.path) / "config.json"
    if cfg.is_file():
        hf = json.loads(cfg.read_text())
        hf = hf.get("text_config", hf)
        if not (hf.get("num_experts") or hf.get("num_local_experts")):
            raise ValueError(f"actor.routing_replay: {config.actor.path} is a dense model "
                             f"({', '.join(hf.get('architectures') or ['?'])}, no experts to "
                             "replay); set actor.routing_replay=false")
    config.gconfig.return_routed_experts = True
    config.servers.enable_return_routed_experts = True
    if config.ref is not None:  # the reference log-probs go through the same experts
        config.ref.routing_replay = True

class GRPOConfig(BaseExperimentConfig):
    kind: Literal["grpo"] = Field("grpo", description="Which experiment this file configures.")
    async_training: bool = Field(True, description="prepare_batch (async) or rollout_batch (sync).")
    total_train_seconds: float | None = Field(
        None, gt=0,
        description="Stop after the step that crosses this many seconds of training wall-clock "
        "time (evaluation excluded); None: no time budget.",
    )
    actor: PPOActorConfig = Field(
        default_factory=PPOActorConfig, description="The policy and its PPO loss.")
    ref: PPOActorConfig | None = Field(None, description="Frozen reference model (kl_ctl > 0).")
    critic: PPOCriticConfig | None = Field(
        None, description="Value model of PPO with GAE (actor.adv_estimator=gae), trained on "
        "the returns each step; path empty: the actor's backbone under a fresh value head. "
        "None: no critic (values 0).")
    rollout: InferenceEngineConfig = Field(
        default_factory=InferenceEngineConfig,
        description="The inference client, staleness gate and executor.")
    gconfig: GenerationHyperparameters = Field(
        default_factory=GenerationHyperparameters, description="Sampling for training episodes.")
    eval_gconfig: GenerationHyperparameters | None = Field(
        None, description="Generation settings for evaluation; None: greedy gconfig."
    )
    reward_model: InferenceEngineConfig | None = Field(
        None, description="Client of a reward-model server pool (servers started with "
        "--is-embedding: its server_addrs, else AREAL_RM_SERVER_ADDRS, which the launcher sets "
        "for launcher.reward_model_servers); the workflow gets it as reward_model, combined with "
        "reward_fn per workflow.kwargs.reward_model_combine. None: rule rewards.")
    workflow: WorkflowConfig = Field(
        default_factory=WorkflowConfig, description="The rollout workflow and its reward.")
    servers: ServersConfig = Field(
        default_factory=ServersConfig, description="Inference server launch flags (this section "
        "was called `sglang`; that name still loads, with a warning).")
    weight_update: WeightUpdateConfig = Field(
        default_factory=WeightUpdateConfig, description="How new weights reach the servers.")
    launcher: LauncherConfig = Field(
        default_factory=LauncherConfig, description="Which processes start, and where.")

    @model_validator(mode="before")
    @classmethod
    def _colocate(cls, data: Any) -> Any:
        return apply_colocate(data)  # launcher.colocate's implications (config/launcher.py)

    @model_validator(mode="after")
    def _check(self) -> GRPOConfig:
        if self.actor.group_size != self.gconfig.n_samples:
            raise ValueError(
                f"actor.group_size ({self.actor.group_size}) must equal gconfig.n_samples "
                f"({self.gconfig.n_samples})"
            )
        if self.launcher.reward_model_servers is not None and self.reward_model is None:
            raise ValueError("launcher.reward_model_servers starts a reward-model pool: set "
                             "reward_model (its client, e.g. `reward_model: {}`) too")
        if self.actor.kl_ctl > 0 and self.ref is None:
            raise ValueError("actor.kl_ctl > 0 needs a `ref` model")
        if self.critic is not None and (self.actor.adv_estimator != "gae"
                                        or self.launcher.colocate
                                        or self.recover.mode != "disabled"):
            raise ValueError("critic: needs actor.adv_estimator=gae (the only estimator that "
                             "uses values), and is not offloaded by launcher.colocate nor saved "
                             "in recovery checkpoints yet (recover.mode=disabled)")
        if self.actor.routing_replay:
            check_routing_replay(self)
        if self.actor.lora is not None and self.weight_update.type == "distributed":
            raise ValueError("actor.lora pushes only its adapter, through disk or in memory: "
                             "set weight_update.type=disk or tensor")
        opt = self.actor.optimizer
        if (self.total_train_seconds and self.total_train_steps is None and opt is not None
                and opt.lr_scheduler_type != "constant"):
            # A decay needs the run's length in steps; a time budget does not give one, and
            # decaying over total_train_epochs would leave the lr near its peak at the cut.
            raise ValueError(
                f"total_train_seconds gives no step count for a {opt.lr_scheduler_type} lr "
                "schedule: use actor.optimizer.lr_scheduler_type=constant (with warmup_steps), "
                "or set total_train_steps"
            )
        return self


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
