"""How a run is kept: ``saver``, ``evaluator``, ``recover``, ``stats_logger`` and ``cluster``
(where its files go)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from arealite.api.config.base import BaseConfig


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
    samples_every: int | None = Field(10, ge=1, description="(RL) Every N steps (and at step 1), "
                                      "a few of the step's samples on the console: the end of "
                                      "the prompt, the reply and its reward (the step's best "
                                      "and worst first). None: off.")
    samples_shown: int = Field(2, ge=1, description="Samples shown each samples_every steps.")
    metrics_port: int | None = Field(None, ge=0, le=65535, description="Serve the trainer's Prometheus /metrics: rank r on metrics_port + r (0: any free port). None: off. See docs/observability.md.")
    metrics_host: str = Field("127.0.0.1", description="Address the trainer's /metrics binds to.")
    trace: bool = Field(False, description="Write a Chrome/Perfetto trace of every step (episodes, generation segments per server, reward calls, phases, weight pushes) to logs/trace_rank{r}.json.")


class ClusterConfig(BaseConfig):
    fileroot: str = Field("outputs", description="Root folder for logs, checkpoints, metrics.")
