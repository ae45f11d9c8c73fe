"""The ``launcher`` section: which processes start, and where (locally, on Ray), the reward-model
pool started beside the servers, and co-location.

``launcher.colocate`` is the one switch between disaggregated async mode and co-located sync
mode. Before a GRPO config is validated, ``apply_colocate`` sets what co-location implies, so the
same config file (and entry script, and workflows) runs either way:

- ``async_training: false``: servers and trainer take turns, so generation cannot run ahead;
- ``weight_update.type: tensor`` (a ``disk`` choice is kept; ``distributed`` becomes ``tensor``):
  weights move through shared memory on the host;
- ``launcher.n_servers = launcher.trainer_nproc``: one server per trainer rank.

A value the file set otherwise is overridden with a warning that names it.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from pydantic import Field

from arealite.api.config.base import BaseConfig

logger = logging.getLogger("arealite.api.config.launcher")


class RayLauncherConfig(BaseConfig):
    """Placement on a Ray cluster (``python -m arealite.launcher.ray``): where servers and the
    trainer go, and what Ray does when a server dies."""

    server_resources: dict[str, float] = Field(
        default_factory=dict,
        description="Ray custom resources each server actor holds (e.g. {inference: 1}); only "
        "nodes started with them (ray start --resources) host servers. {}: any node.",
    )
    trainer_resources: dict[str, float] = Field(
        default_factory=dict,
        description="Ray custom resources the trainer actor holds (e.g. {trainer: 1}); picks "
        "the trainer's node. {}: any node.",
    )
    server_restarts: int = Field(
        0, ge=0,
        description="Times Ray restarts a server actor whose server process died (max_restarts). "
        "The restarted server binds the same node and port, and the client re-admits it once it "
        "holds the current weights; past this, a dead server counts against "
        "launcher.max_server_failures.",
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
    overwrite: bool = Field(
        False, description="Replace what the run folder ({fileroot}/{experiment}/{trial}) and an "
        "output_dir outside it already hold (their model files only). Without it a launch into "
        "a folder that holds a run is refused, unless recovery resumes it "
        "(arealite/launcher/run_folder.py).",
    )
    memory_check: bool = Field(
        True, description="Before starting anything on GPUs, predict the trainer's and the "
        "servers' peak memory (arealite.memplan, `arealite plan`) and refuse, with one line "
        "naming the knob that fits, a run over the GPU's memory less a 10% margin. Skipped on "
        "CPU runs.")
    gpu: str = Field(
        "H100-80GB", description="The accelerator the memory check plans for (a name from "
        "arealite.memplan.gpus, or a size such as 24GiB).")
    ray: RayLauncherConfig = Field(default_factory=RayLauncherConfig,
                                   description="Placement on a Ray cluster (arealite.launcher.ray).")


def _section(data: dict, key: str) -> dict:
    v = data.get(key)
    if v is None:
        return {}
    return dict(v) if isinstance(v, dict) else v.model_dump(exclude_unset=True)


def apply_colocate(data: Any) -> Any:
    """The raw GRPO config with co-location's implications set (unchanged when it is off)."""
    if not isinstance(data, dict):
        return data
    launcher = _section(data, "launcher")
    if not launcher.get("colocate"):
        return data
    data, wu = dict(data), _section(data, "weight_update")
    changes = ["async_training=false"] if data.get("async_training", False) else []
    data["async_training"] = False
    if wu.get("type") == "distributed":
        changes.append("weight_update.type=tensor")
    if wu.get("type") in (None, "distributed"):
        wu["type"] = "tensor"
    data["weight_update"] = wu
    nproc = int(launcher.get("trainer_nproc", 1))
    if launcher.get("n_servers", nproc) != nproc:
        changes.append(f"launcher.n_servers={nproc}")
    launcher["n_servers"] = nproc
    data["launcher"] = launcher
    if changes:
        logger.warning("launcher.colocate=true sets %s", ", ".join(changes))
    return data
