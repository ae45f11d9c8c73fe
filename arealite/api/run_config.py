"""Settings of how a run is deployed and kept: servers, weight updates, launcher, saving,
evaluation, recovery, logging and the cluster's folders. Part of the one config tree
(``arealite.api.config`` re-exports every class here)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from arealite.api.config_base import BaseConfig
from arealite.api.ray_config import RayLauncherConfig

# --------------------------------------------------------------------------- servers


class SGLangConfig(BaseConfig):
    """Server launch settings, named as ``python -m sglang.launch_server`` flags."""

    model_path: str = Field("", description="Model dir; empty uses the actor's path.")
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = Field(
        "auto", description="--dtype"
    )
    random_seed: int | None = Field(1, description="--random-seed")
    context_length: int | None = Field(None, ge=1, description="--context-length")
    max_running_requests: int | None = Field(None, ge=1, description="--max-running-requests")
    mem_fraction_static: float | None = Field(None, gt=0, le=1, description="--mem-fraction-static")
    tp_size: int = Field(1, ge=1, description="--tp-size")
    skip_tokenizer_init: bool = Field(False, description="--skip-tokenizer-init")
    enable_metrics: bool = Field(False, description="--enable-metrics")
    log_level: str = Field("warning", description="--log-level")
    device: str = Field("auto", description="--device (cpu, cuda, auto)")
    api_key: str | None = Field(None, description="--api-key")
    admin_api_key: str | None = Field(None, description="--admin-api-key")
    extra_args: list[str] = Field(default_factory=list, description="More flags, passed verbatim.")


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


class RewardModelServersConfig(BaseConfig):
    """A reward-model server pool the launcher starts beside the generation servers (``python -m
    servers.launch_server --is-embedding`` or SGLang's); the trainer's ``reward_model`` client
    gets their addresses in ``AREAL_RM_SERVER_ADDRS``."""

    model_path: str = Field(..., min_length=1, description="The reward model's HF directory "
                            "(a *ForSequenceClassification checkpoint).")
    n_servers: int = Field(1, ge=1, description="Reward-model servers to start.")
    threads: int = Field(1, ge=1, description="torch threads per reward-model server.")
    backend: Literal["embedded", "sglang"] = Field(
        "embedded", description="embedded: servers/ (CPU or GPU); sglang: real SGLang. "
        "Independent of launcher.server_backend (vLLM serves no reward model here).")
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = Field(
        "auto", description="--dtype of the reward-model servers.")
    extra_args: list[str] = Field(default_factory=list, description="More flags, passed verbatim.")


class LauncherConfig(BaseConfig):
    n_servers: int = Field(1, ge=1, description="Inference servers to start.")
    server_backend: Literal["embedded", "sglang", "vllm"] = Field(
        "embedded", description="embedded: servers/ on CPU or GPU; sglang: real SGLang; vllm: "
        "real vLLM from .venv-vllm (make setup-vllm; distributed updates over vLLM's NCCL "
        "weight transfer on GPUs, from disk on CPU).",
    )
    trainer_nproc: int = Field(1, ge=1, description="Trainer processes (torchrun --nproc-per-node).")
    mode: Literal["local", "server_only", "trainer_only"] = Field(
        "local", description="Start servers and trainer, only servers, or only the trainer."
    )
    server_threads: int = Field(1, ge=0, description="torch threads per server; 0: auto "
                                "(the machine's cores split over servers and trainer ranks).")
    trainer_threads: int = Field(1, ge=0, description="torch threads per trainer rank; 0: auto "
                                 "(the cores the servers leave, split over the ranks).")
    startup_timeout: float = Field(180.0, gt=0, description="Seconds for servers to come up.")
    gpus_per_server: int = Field(0, ge=0, description="GPUs given to each server (0 on CPU).")
    server_host: str = Field(
        "127.0.0.1",
        description="Address servers bind to; 0.0.0.0 serves other machines (reached by hostname).",
    )
    entry_module: str | None = Field(
        None, description="Trainer module for torchrun -m; None: arealite.trainer.<kind>."
    )
    stop_grace: float = Field(
        10.0, gt=0, description="Seconds between SIGTERM and SIGKILL when stopping a process."
    )
    max_server_failures: int = Field(
        0, ge=0,
        description="Servers that may die after start-up before the run is stopped "
        "(the client routes around dead servers); 0 stops at the first.",
    )
    colocate: bool = Field(
        False, description="Co-located mode: one server per trainer rank on the trainer's host "
        "(the same GPU on GPUs), taking turns with its memory: generate -> release servers -> "
        "train -> resume -> push by shared memory. Implies async_training=false, "
        "weight_update.type=tensor (unless disk) and n_servers=trainer_nproc "
        "(docs/weight_updates.md#co-located-mode).",
    )
    reward_model_servers: RewardModelServersConfig | None = Field(
        None, description="(GRPO) A reward-model pool to start with the generation servers "
        "(mode local or server_only), health-checked and stopped with them; its addresses go to "
        "the `reward_model` client (set that section too). Each server gets gpus_per_server "
        "GPUs after the generation servers'. None: none started (reward_model.server_addrs).")
    colocate_servers: Literal["release", "recreate"] = Field(
        "release", description="Co-located mode, what the servers do during the train phase: "
        "release (their memory released and resumed, the processes stay) or recreate (the "
        "local launcher stops them and starts them again for the next rollout phase, the push "
        "giving them the newest weights; frees everything they held, at the price of a server "
        "start-up per step; local launcher only).",
    )
    ray: RayLauncherConfig = Field(default_factory=RayLauncherConfig,
                                   description="Placement on a Ray cluster (arealite.launcher.ray).")


# --------------------------------------------------------------------------- bookkeeping


class SaverConfig(BaseConfig):
    freq_epochs: int | None = Field(None, ge=1, description="Save every N epochs.")
    freq_steps: int | None = Field(None, ge=1, description="Save every N steps.")
    freq_secs: float | None = Field(None, gt=0, description="Save every N seconds.")


class EvaluatorConfig(SaverConfig):
    n_samples: int = Field(1, ge=1, description="Samples per held-out prompt.")
    max_prompts: int | None = Field(None, ge=1, description="Cap on held-out prompts per eval.")
    eval_fn: str | None = Field(
        None,
        description="(GRPO) Your evaluation, `module:function`, called as fn(engine, rows) -> dict of "
        "floats (plus tokenizer=, workflow=, version=, config= when it takes them) on the held-out rows, "
        "with no training episode in flight; None: mean greedy reward (eval/accuracy). Its "
        "time is logged as timeperf/eval and not counted in total_train_seconds.",
    )


class RecoverConfig(SaverConfig):
    mode: Literal["disabled", "auto", "resume"] = Field(
        "disabled", description="auto: resume from a recovery checkpoint when one exists."
    )
    retries: int = Field(3, ge=0, description="Restarts the launcher allows in auto mode.")


class StatsLoggerConfig(BaseConfig):
    tensorboard: bool = Field(True, description="Write tensorboard event files.")
    wandb_mode: Literal["disabled", "online", "offline"] = Field(
        "disabled", description="Weights & Biases mode (when wandb is installed)."
    )
    wandb_project: str = Field("arealite", description="wandb project name.")
    print_every: int = Field(1, ge=1, description="Console line every N steps.")
    metrics_port: int | None = Field(None, ge=0, le=65535, description="Serve the trainer's Prometheus /metrics: rank r on metrics_port + r (0: any free port). None: off. See docs/observability.md.")
    metrics_host: str = Field("127.0.0.1", description="Address the trainer's /metrics binds to.")
    trace: bool = Field(False, description="Write a Chrome/Perfetto trace of every step (episodes, generation segments per server, reward calls, phases, weight pushes) to logs/trace_rank{r}.json.")


class ClusterConfig(BaseConfig):
    fileroot: str = Field("outputs", description="Root folder for logs, checkpoints, metrics.")
