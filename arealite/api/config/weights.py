"""The ``weight_update`` section: how new weights reach the servers (docs/weight_updates.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from arealite.api.config.base import BaseConfig


class ConsistencyGateConfig(BaseConfig):
    """``weight_update.consistency``: the servers' next-token distributions against the
    trainer's, at step 0 and after pushes (``arealite/weights/consistency_gate.py``)."""

    enabled: bool = Field(True, description="Run the gate at step 0 and after weight pushes "
                          "(SGLang-protocol servers, full-weight runs; off with actor.lora).")
    every: int = Field(10, ge=1, description="Check after every N-th push (step 0 always; 1: "
                       "every push, about a forward and a short generation each).")
    probes: int = Field(4, ge=1, le=64, description="Probe prompts: the first held-out rows "
                        "(training rows when there are none), encoded by the workflow.")
    max_new_tokens: int = Field(8, ge=1, le=256, description="Tokens each server generates per "
                                "probe; every generated position is compared.")
    top_k: int = Field(8, ge=1, le=64, description="Log-probs per position the servers return "
                       "(top_logprobs_num); the KL is over these plus the tail mass.")
    seed: int = Field(0, description="sampling_seed of the probes (the same tokens every check).")
    max_kl: float | None = Field(0.02, ge=0, description="Largest mean KL(server || trainer) "
                                 "over top-k plus tail that passes; None: not judged.")
    max_argmax_mismatch: float | None = Field(
        0.25, ge=0, le=1, description="Largest share of positions whose argmax differs that "
        "passes; None: not judged.")
    max_logprob_gap: float | None = Field(None, ge=0, description="Largest |server - trainer| "
                                          "top-k log-prob gap that passes; None: not judged.")
    action: Literal["warn", "stop"] = Field(
        "warn", description="On a failed check: warn logs an error line per server and goes "
        "on; stop ends the run (ConsistencyGateError on every rank).")
    timeout: float = Field(120.0, gt=0, description="Seconds for one server's probe answer.")


class WeightUpdateConfig(BaseConfig):
    type: Literal["disk", "distributed", "tensor"] = Field(
        "disk", description="disk: save HF files and reload; distributed: broadcast over a group "
        "(vLLM servers: vLLM's NCCL weight transfer, GPUs only; on CPU it falls back to disk); "
        "tensor: servers on the trainer's host get /update_weights_from_tensor by shared-memory "
        "(CUDA IPC on GPUs) reference, each trainer rank pushing to its own servers "
        "(docs/weight_updates.md). With actor.lora, only the adapter moves, with no pause: disk "
        "(/load_lora_adapter) or tensor (trainer rank 0 posts /load_lora_adapter_from_tensors "
        "to servers on its host); distributed is refused.",
    )
    lora_pause: bool = Field(
        False, description="With actor.lora: pause the servers (rollout.pause_mode) around each "
        "adapter load, as a full-weight update does, instead of loading each version beside the "
        "running ones with nothing paused (the default; docs/weight_updates.md).")
    bucket_size_mb: float = Field(64.0, gt=0, description="Bucket size (MiB) of a broadcast or "
                                  "tensor update.")
    master_address: str = Field("127.0.0.1", description="Trainer address for the broadcast group.")
    master_port: int | None = Field(None, ge=1, le=65535, description="None picks a free port.")
    group_name: str = Field("weight_update_group", description="Broadcast group name.")
    timeout: float = Field(600.0, gt=0, description="Seconds before an update is abandoned.")
    retries: int = Field(1, ge=0, description="Times a broadcast update that lost a server (it "
                         "died before or inside the update) is retried over the live servers.")
    verify: bool = Field(
        True, description="After each update, compare every server's /weights_checker checksums "
        "with the trainer's; a mismatch re-syncs that server, a second one stops the run.",
    )
    checksum_dtype: Literal["bfloat16", "float16", "float32"] | None = Field(
        None, description="dtype the servers hold weights in, when it differs from the trainer's "
        "(tensors are hashed in it); None: as sent.",
    )
    consistency: ConsistencyGateConfig = Field(
        default_factory=ConsistencyGateConfig,
        description="The next-token distribution gate after pushes (docs/weight_updates.md).")
