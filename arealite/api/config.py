"""The whole system's settings as one typed tree (pydantic).

Every model forbids unknown keys and validates on assignment, so a typo in a YAML file or a
``key=value`` override is an error naming the key, never a silently ignored setting.
Loading, overrides and error messages live in ``arealite.api.config_loader``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from arealite.api.algorithm_config import PPOAlgorithmOptions
from arealite.api.colocate_config import apply_colocate
from arealite.api.config_base import BaseConfig
from arealite.api.lora_config import LoRAConfig

# Re-exported: one config tree, whichever module a class is written in.
from arealite.api.run_config import (  # noqa: F401
    ClusterConfig,
    EvaluatorConfig,
    LauncherConfig,
    RecoverConfig,
    RewardModelServersConfig,
    SaverConfig,
    SGLangConfig,
    StatsLoggerConfig,
    WeightUpdateConfig,
)

# --------------------------------------------------------------------------- generation


class GenerationHyperparameters(BaseConfig):
    """Sampling settings for one rollout request (mapped onto SGLang's ``sampling_params``)."""

    n_samples: int = Field(1, ge=1, description="Samples generated per prompt (the GRPO group).")
    max_new_tokens: int = Field(16, ge=0, description="Maximum tokens generated per sample.")
    min_new_tokens: int = Field(0, ge=0, description="Minimum tokens before EOS may end a sample.")
    greedy: bool = Field(False, description="Greedy decoding (sent as temperature 0).")
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature; 0 is greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass, in (0, 1].")
    top_k: int = Field(-1, description="Top-k sampling; -1 keeps every token.")
    min_p: float = Field(0.0, ge=0.0, le=1.0, description="Min-p filtering threshold.")
    stop_token_ids: list[int] = Field(
        default_factory=list,
        description="Token ids that end a sample besides the model's EOS (none stop under "
        "ignore_eos); RLVRWorkflow adds the tokenizer's EOS, and pad unless stop_on_pad=false.",
    )
    stop: list[str] | None = Field(None, description="Stop strings (need a server tokenizer).")
    ignore_eos: bool = Field(
        False, description="Turn off every token-based stop: EOS and stop_token_ids (as SGLang)."
    )
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0, description="SGLang frequency penalty.")

    @model_validator(mode="after")
    def _check(self) -> GenerationHyperparameters:
        if self.top_k != -1 and self.top_k < 1:
            raise ValueError("top_k must be -1 (all tokens) or >= 1")
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError("min_new_tokens must be <= max_new_tokens")
        return self

    def new(self, **kwargs: Any) -> GenerationHyperparameters:
        """A validated copy with some fields replaced."""
        return type(self).model_validate({**self.model_dump(), **kwargs})


# --------------------------------------------------------------------------- training


class OptimizerConfig(BaseConfig):
    type: Literal["adamw"] = Field("adamw", description="Optimizer (AdamW).")
    lr: float = Field(1e-5, gt=0.0, description="Peak learning rate.")
    weight_decay: float = Field(0.0, ge=0.0, description="Decoupled weight decay.")
    beta1: float = Field(0.9, ge=0.0, lt=1.0, description="Adam beta1.")
    beta2: float = Field(0.999, ge=0.0, lt=1.0, description="Adam beta2.")
    eps: float = Field(1e-8, gt=0.0, description="Adam epsilon.")
    lr_scheduler_type: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="Learning-rate schedule after warm-up."
    )
    warmup_steps_proportion: float = Field(
        0.0, ge=0.0, le=1.0, description="Fraction of all optimizer steps spent warming up."
    )
    warmup_steps: int | None = Field(
        None, ge=0,
        description="Warm-up length in optimizer steps; overrides warmup_steps_proportion. With "
        "lr_scheduler_type=constant it needs no known run length (time-capped runs).",
    )
    min_lr_ratio: float = Field(
        0.0, ge=0.0, le=1.0, description="Final lr as a fraction of the peak (linear/cosine)."
    )
    gradient_clipping: float = Field(1.0, gt=0.0, description="Max global gradient norm.")


class MixedPrecisionConfig(BaseConfig):
    param_dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="Dtype of parameters during forward/backward (FSDP2 policy)."
    )
    reduce_dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="Dtype of gradient reduction (FSDP2 policy)."
    )


class TrainEngineConfig(BaseConfig):
    """One model trained with FSDP2 (actor, critic, reference or SFT model)."""

    path: str = Field("", description="HF model directory (or hub name) to load.")
    init_from_scratch: bool = Field(False, description="Build from the config at `path`, random init.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="Master parameter dtype."
    )
    mixed_precision: MixedPrecisionConfig = Field(
        default_factory=MixedPrecisionConfig, description="Parameter and reduction dtypes.")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward.")
    cpu_offload: bool = Field(False, description="FSDP2 CPU offload of parameters/optimizer.")
    optimizer: OptimizerConfig | None = Field(
        default_factory=OptimizerConfig, description="None for a frozen model (e.g. reference)."
    )
    max_tokens_per_mb: int = Field(
        8192, ge=1, description="Token budget of one packed micro-batch."
    )
    attn_impl: Literal["auto", "segments", "flex", "sdpa", "eager", "flash_attention_2"] = Field(
        "auto", description="Attention kernel; auto picks flash-attn varlen on CUDA when present, "
        "else segments (per-sequence SDPA, no dense mask); flex: the same masks as a "
        "FlexAttention block mask (CUDA only); sdpa/eager use a dense [T, T] mask.",
    )
    lora: LoRAConfig | None = Field(
        None, description="Train a LoRA adapter (peft) over frozen base weights; null trains "
        "every weight. See docs/quickstart.md#lora.")


class PPOActorConfig(TrainEngineConfig, PPOAlgorithmOptions):
    """Actor (or reference) model with the PPO/GRPO loss and advantage settings (algorithm
    choices: ``arealite.api.algorithm_config``)."""

    group_size: int = Field(1, ge=1, description="Samples per prompt (GRPO group).")
    ppo_n_minibatches: int = Field(1, ge=1, description="Optimizer steps per trainer step.")
    eps_clip: float = Field(0.2, gt=0.0, description="PPO ratio clip (lower, and upper if no higher).")
    eps_clip_higher: float | None = Field(
        None, description="Separate upper clip (DAPO clip-higher); None uses eps_clip."
    )
    c_clip: float | None = Field(
        None, description="Dual-clip constant (> 1) bounding negative-advantage losses; None off."
    )
    temperature: float = Field(
        1.0, gt=0.0, description="Temperature for recomputed logprobs; must equal generation's."
    )
    reward_bias: float = Field(0.0, description="Added to every reward.")
    reward_scaling: float = Field(1.0, description="Multiplies every reward after the bias.")
    reward_clip: float = Field(20.0, gt=0.0, description="Rewards clipped to [-clip, clip].")
    group_reward_norm: bool = Field(
        False, description="Normalise rewards within each group (of group_size consecutive rows, "
        "or by the group_baseline / group_scale keys a workflow such as AgentWorkflow gives)."
    )
    group_adv_norm: bool = Field(False, description="Normalise advantages within each group.")
    adv_norm: bool = Field(True, description="Normalise advantages over the whole batch.")
    kl_ctl: float = Field(0.0, ge=0.0, description="KL penalty against the reference model.")
    discount: float = Field(1.0, ge=0.0, le=1.0, description="GAE discount (gamma).")
    gae_lambda: float = Field(1.0, ge=0.0, le=1.0, description="GAE lambda.")
    mask_no_eos_with_zero: bool = Field(
        False, description="Zero the reward of samples truncated before EOS."
    )
    recompute_logprob: bool = Field(
        True, description="Recompute proximal logprobs with the current weights before updating."
    )
    use_decoupled_loss: bool = Field(
        True, description="Decoupled PPO loss: clip against proximal, weight by behaviour IS."
    )
    behav_imp_weight_cap: float | None = Field(
        None, description="Tokens whose behaviour importance weight exceeds this are masked."
    )
    shared_prompt_packing: bool = Field(
        True, description="Compute each GRPO group's common prompt once per micro-batch "
        "(prefix-tree attention; same losses and gradients). Needs attn_impl segments, flex or auto.",
    )

    @model_validator(mode="after")
    def _check(self) -> PPOActorConfig:
        if self.c_clip is not None and self.c_clip <= 1.0:
            raise ValueError("c_clip must be > 1 (dual clip) or null")
        if self.use_decoupled_loss and not self.recompute_logprob:
            raise ValueError("use_decoupled_loss needs recompute_logprob=true (proximal logprobs)")
        return self


class PPOCriticConfig(TrainEngineConfig):
    """Value model for PPO with GAE (optional; GRPO needs none)."""

    ppo_n_minibatches: int = Field(1, ge=1, description="Optimizer steps per trainer step.")
    value_eps_clip: float | None = Field(
        0.2, description="Clip of the new value around the old one (PPO value clipping); None off."
    )


# --------------------------------------------------------------------------- rollout


class InferenceEngineConfig(BaseConfig):
    """The client side of the server pool and the rollout executor."""

    server_addrs: list[str] = Field(
        default_factory=list,
        description="host:port of each server; empty reads AREAL_LLM_SERVER_ADDRS.",
    )
    max_concurrent_rollouts: int | None = Field(
        None, ge=1, description="Episodes running at once; None uses consumer_batch_size."
    )
    queue_size: int | None = Field(
        None, ge=1, description="Bound of the input/output queues; None derives from batch size."
    )
    consumer_batch_size: int = Field(1, ge=1, description="Episodes per trainer batch (B).")
    max_head_offpolicyness: int = Field(
        0, ge=0, description="eta: the most weight versions a trajectory may lag the trainer."
    )
    schedule_policy: Literal["round_robin", "least_inflight"] = Field(
        "round_robin", description="How requests are spread over servers."
    )
    sticky_rids: bool = Field(True, description="Keep every request of one rid on one server.")
    setup_timeout: float = Field(120.0, gt=0, description="Seconds to wait for servers' /health.")
    request_timeout: float = Field(3600.0, gt=0, description="Seconds per /generate call.")
    request_retries: int = Field(3, ge=0, description="Retries of a failed call, on other servers.")
    episode_retries: int = Field(
        2, ge=0, description="Times the prompt of a failed episode (its workflow raised: a "
        "generation failed after all retries, a reward failed) is drawn again before it is "
        "dropped (counted as rollout/dropped)."
    )
    unhealthy_after_failures: int = Field(
        3, ge=1, description="Consecutive failures before a server leaves the pool."
    )
    health_check_interval: float = Field(
        2.0, gt=0, description="Seconds between probes of unhealthy servers."
    )
    weight_update_timeout: float = Field(
        600.0, gt=0, description="Seconds for each step of a weight update."
    )
    pause_mode: Literal["abort", "retract", "in_place"] = Field(
        "abort", description="SGLang /pause_generation mode used around weight updates."
    )
    api_key: str | None = Field(
        None, description="Key sent as Authorization: Bearer on every call; None reads "
        "AREALITE_API_KEY (keeps it out of YAML).",
    )
    admin_api_key: str | None = Field(
        None, description="Key sent on weight, pause and version calls; None reads "
        "AREALITE_ADMIN_API_KEY, else the api key is used.",
    )


class DatasetConfig(BaseConfig):
    path: str = Field("", description="Local JSON/JSONL/CSV file, or an HF datasets name.")
    name: str | None = Field(None, description="HF datasets config name.")
    split: str = Field("train", description="Split to load.")
    batch_size: int = Field(1, ge=1, description="Prompts per batch.")
    shuffle: bool = Field(True, description="Shuffle each epoch (seeded).")
    num_workers: int = Field(0, ge=0, description="DataLoader worker processes.")
    drop_last: bool = Field(True, description="Drop the last incomplete batch.")
    max_length: int | None = Field(None, ge=1, description="Drop prompts longer than this.")


class WorkflowConfig(BaseConfig):
    """The rollout workflow, named by import path (``package.module:ClassName``)."""

    path: str = Field("workflows.rlvr:RLVRWorkflow", description="Workflow class import path.")
    reward_fn: str = Field(
        "workflows.rewards.toy:toy_reward", description="Reward function import path."
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra keyword arguments for the workflow. RLVRWorkflow takes "
        "apply_chat_template (default true: a `prompt`/`question` row becomes one user turn "
        "of the tokenizer's chat template; false tokenizes it as plain text; rows with "
        "`input_ids` are used as is), system_prompt, template_kwargs, reward_timeout, "
        "dump_dir and stop_on_pad (default true: the tokenizer's pad token stops a sample "
        "besides EOS, as AReaL's RLVR client sends; false when pad is an ordinary token).",
    )



# --------------------------------------------------------------------------- experiments


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
    sglang: SGLangConfig = Field(
        default_factory=SGLangConfig, description="Inference server launch flags.")
    weight_update: WeightUpdateConfig = Field(
        default_factory=WeightUpdateConfig, description="How new weights reach the servers.")
    launcher: LauncherConfig = Field(
        default_factory=LauncherConfig, description="Which processes start, and where.")

    @model_validator(mode="before")
    @classmethod
    def _colocate(cls, data: Any) -> Any:
        return apply_colocate(data)  # launcher.colocate's implications (api/colocate_config.py)

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
