"""The client side of generation: ``rollout`` (and ``reward_model``, the same client over a
reward-model pool) and the sampling settings ``gconfig`` / ``eval_gconfig``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from arealite.api.config.base import BaseConfig


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
    # Structured outputs (SGLang's grammar sampling params; the servers' grammar backend enforces
    # them token by token). A paused request that carries one restarts from its prompt instead
    # of resuming: a grammar sent again would start over at the generated prefix.
    json_schema: str | None = Field(
        None, description="Constrain each sample to this JSON schema (SGLang's json_schema)."
    )
    regex: str | None = Field(None, description="Constrain each sample to this regex.")
    ebnf: str | None = Field(None, description="Constrain each sample to this EBNF grammar.")
    return_routed_experts: bool = Field(
        False, description="Ask the servers for each token's routed experts (SGLang's "
        "return_routed_experts; servers launched with servers.enable_return_routed_experts): "
        "the trajectories carry them for the actor's routing_replay.",
    )

    @model_validator(mode="after")
    def _check(self) -> GenerationHyperparameters:
        if self.top_k != -1 and self.top_k < 1:
            raise ValueError("top_k must be -1 (all tokens) or >= 1")
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError("min_new_tokens must be <= max_new_tokens")
        if sum(x is not None for x in (self.json_schema, self.regex, self.ebnf)) > 1:
            raise ValueError("set at most one of json_schema, regex and ebnf")
        return self

    @property
    def constrained(self) -> bool:
        """Whether samples follow a grammar (json_schema, regex or ebnf)."""
        return self.json_schema is not None or self.regex is not None or self.ebnf is not None

    def new(self, **kwargs: Any) -> GenerationHyperparameters:
        """A validated copy with some fields replaced."""
        return type(self).model_validate({**self.model_dump(), **kwargs})


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
