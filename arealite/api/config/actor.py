"""The trained models' sections (``actor``, ``ref``, ``critic``; ``model`` of SFT, DPO and
the reward model): the FSDP2 engine, its optimizer and dtypes, its LoRA adapter, and the PPO
actor's loss and advantage settings.

The algorithm choices of the PPO actor (advantage estimator, policy loss, loss aggregation,
train–inference mismatch correction, DAPO's overlong shaping) are ``PPOAlgorithmOptions``, mixed
into ``PPOActorConfig``. Each ``Literal`` value names one function in a registry of
``arealite.engine.ppo`` (the engine looks the name up and never branches on it); formulas and
when to pick each: ``docs/algorithms.md``. Every default keeps the behaviour arealite had before
the choices.

With ``lora`` set the base weights stay frozen: only the adapter matrices get gradients and
optimizer state, checkpoints and weight pushes carry only the adapter (peft's on-disk format:
``adapter_config.json`` + ``adapter_model.safetensors``), and the servers run the adapter on top
of their unchanged base model (SGLang's ``/load_lora_adapter``, ``lora_path`` per request).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from arealite.api.config.base import BaseConfig


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
    logprob_head: Literal["fused", "dense"] = Field(
        "fused", description="How a causal LM's per-token log-probs (and entropy) are computed: "
        "fused: from the final hidden states and the head weight in token chunks, with a "
        "backward that recomputes each chunk (no [tokens x vocab] logits or gradient; "
        "arealite.engine.lm_head); dense: the model's full logits, as HF computes them. "
        "Models whose head rescales its logits (soft-capping, logit_scale) use dense.")
    logprob_chunk_size: int = Field(
        1024, ge=1, description="Tokens per chunk of the fused head: its extra memory is about "
        "3 x chunk x vocab x 4 bytes (fp32 logits, softmax, gradient of one chunk).")
    context_parallel_size: int = Field(
        1, ge=1, description="Ulysses context parallelism: each packed micro-batch's tokens are "
        "split over this many ranks (attention exchanges heads for tokens with an all-to-all; "
        "arealite.engine.context_parallel). Must divide the trainer's world size and the "
        "attention heads; the ranks of a group train on their rows together. Needs "
        "attn_impl auto/segments, token_mean loss aggregation and no shared-prompt packing.")
    lora: LoRAConfig | None = Field(
        None, description="Train a LoRA adapter (peft) over frozen base weights; null trains "
        "every weight. See docs/quickstart.md#lora.")
    routing_replay: bool = Field(
        False, description="Mixture-of-experts models: route each token through the experts "
        "the inference server used for it (the trajectory's routed_experts), with gate weights "
        "from this model's own router, in every forward (log-prob recompute and update); asks "
        "the servers for them. See docs/moe.md.")

    @model_validator(mode="after")
    def _check_context_parallel(self) -> TrainEngineConfig:
        if self.context_parallel_size > 1 and self.attn_impl not in ("auto", "segments"):
            raise ValueError(f"context_parallel_size > 1 needs attn_impl auto or segments (the "
                             f"all-to-all wraps segment attention), not {self.attn_impl}")
        if self.context_parallel_size > 1 and self.routing_replay:
            raise ValueError("routing_replay with context_parallel_size > 1 is not supported yet "
                             "(the routed experts are not split over the group like the tokens)")
        return self


class PPOAlgorithmOptions(BaseModel):
    """Algorithm fields of ``PPOActorConfig`` (a mixin: the algorithm choices apart from the
    loss constants)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    adv_estimator: Literal[
        "gae", "grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"
    ] = Field("gae", description="Advantage estimator; group_reward_norm, group_adv_norm, "
              "adv_norm, gae_lambda and critic values apply to gae only.")
    policy_loss: Literal["ppo", "gspo", "cispo"] = Field(
        "ppo", description="Policy loss: PPO clip, GSPO (sequence ratio) or CISPO (clipped IS "
        "weight, detached).")
    loss_agg_mode: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"] = (
        Field("token_mean", description="How token losses reduce to the batch loss."))
    loss_agg_norm: float | None = Field(
        None, gt=0, description="Constant divisor of seq_mean_token_sum_norm (Dr.GRPO; e.g. "
        "max_new_tokens).")
    behav_imp_weight_level: Literal["token", "sequence", "geometric"] = Field(
        "token", description="Behaviour IS weight per token, per sample (product) or per sample "
        "(geometric mean).")
    behav_imp_weight_mode: Literal["mask", "truncate"] = Field(
        "mask", description="Beyond behav_imp_weight_cap: weight 0 (masked IS) or cap (TIS).")
    behav_imp_weight_floor: float | None = Field(
        None, gt=0, description="Mask weights below this too (two-sided mask, IcePop); mode=mask.")
    overlong_max_len: int | None = Field(
        None, ge=1, description="DAPO overlong shaping: generated length of the full penalty.")
    overlong_buffer_len: int | None = Field(
        None, ge=1, description="Tokens before overlong_max_len over which the penalty ramps.")
    overlong_penalty_factor: float = Field(
        1.0, ge=0, description="Size of the overlong penalty at overlong_max_len.")
    dynamic_sampling: bool = Field(
        False, description="DAPO dynamic sampling: drop groups whose rewards are all equal and "
        "draw more until the batch is full.")

    @model_validator(mode="after")
    def _check_algorithm(self) -> PPOAlgorithmOptions:
        if self.adv_estimator != "gae" and (getattr(self, "group_reward_norm", False)
                                            or getattr(self, "group_adv_norm", False)):
            raise ValueError("group_reward_norm/group_adv_norm belong to adv_estimator=gae")
        if self.policy_loss == "cispo" and getattr(self, "c_clip", None) is not None:
            raise ValueError("c_clip (dual clip) does not apply to policy_loss=cispo")
        if self.loss_agg_mode == "seq_mean_token_sum_norm" and self.loss_agg_norm is None:
            raise ValueError("loss_agg_mode=seq_mean_token_sum_norm needs loss_agg_norm")
        if self.behav_imp_weight_floor is not None and self.behav_imp_weight_mode != "mask":
            raise ValueError("behav_imp_weight_floor needs behav_imp_weight_mode=mask")
        if (self.overlong_max_len is None) != (self.overlong_buffer_len is None):
            raise ValueError("set both overlong_max_len and overlong_buffer_len, or neither")
        if self.overlong_max_len is not None and self.overlong_buffer_len > self.overlong_max_len:
            raise ValueError("overlong_buffer_len must be <= overlong_max_len")
        return self


class PPOActorConfig(TrainEngineConfig, PPOAlgorithmOptions):
    """Actor (or reference) model with the PPO/GRPO loss and advantage settings (algorithm
    choices: ``PPOAlgorithmOptions``)."""

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
        if self.context_parallel_size > 1:
            # each rank holds a token slice of a micro-batch: only per-token losses divide
            if self.loss_agg_mode != "token_mean":
                raise ValueError(f"context_parallel_size > 1 serves loss_agg_mode=token_mean "
                                 f"only, not {self.loss_agg_mode}")
            if self.shared_prompt_packing and self.group_size > 1:
                raise ValueError("context_parallel_size > 1 does not serve shared-prompt "
                                 "packing yet: set shared_prompt_packing=false")
        return self


class PPOCriticConfig(TrainEngineConfig):
    """Value model for PPO with GAE (optional; GRPO needs none)."""

    ppo_n_minibatches: int = Field(1, ge=1, description="Optimizer steps per trainer step.")
    value_eps_clip: float | None = Field(
        0.2, description="Clip of the new value around the old one (PPO value clipping); None off."
    )
