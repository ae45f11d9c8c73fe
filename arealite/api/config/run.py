"""How a run is kept: ``saver``, ``evaluator``, ``recover``, ``stats_logger`` and ``cluster``
(where its files go)."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field, model_validator

from arealite.api.config.base import BaseConfig


class SaverConfig(BaseConfig):
    freq_epochs: int | None = Field(None, ge=1, description="Save every N epochs.")
    freq_steps: int | None = Field(None, ge=1, description="Save every N steps.")
    freq_secs: float | None = Field(None, gt=0, description="Save every N seconds.")


class LMEvalConfig(BaseConfig):
    tasks: list[str] = Field(
        default_factory=list,
        description="EleutherAI lm-eval tasks run against the run's servers at each evaluation "
        "(local-completions on /v1/completions); metrics logged as eval/lm_eval/<task>/<metric>. "
        "Empty: none. See docs/observability.md.",
    )
    python: str = Field(".venv-lmeval/bin/python", description="Python of the lm-eval virtualenv (make setup-lmeval).")
    include_path: str | None = Field(None, description="Folder of your own task YAMLs (lm_eval --include_path).")
    limit: int | None = Field(None, ge=1, description="Documents per task (lm_eval --limit); None: all.")
    num_fewshot: int | None = Field(None, ge=0, description="lm_eval --num_fewshot; None: the task's default.")
    num_concurrent: int = Field(4, ge=1, description="Requests lm-eval keeps in flight.")
    timeout: float = Field(3600.0, gt=0, description="Seconds one lm-eval run may take.")

    @model_validator(mode="after")
    def _python_exists(self) -> LMEvalConfig:
        if self.tasks and not os.path.exists(self.python):
            raise ValueError(f"evaluator.lm_eval.python {self.python!r} does not exist "
                             "(make setup-lmeval builds .venv-lmeval)")
        return self


class EvaluatorConfig(SaverConfig):
    n_samples: int = Field(1, ge=1, description="Samples per held-out prompt.")
    max_prompts: int | None = Field(None, ge=1, description="Cap on held-out prompts per eval.")
    max_concurrent: int | None = Field(
        None, ge=1, description="Evaluation episodes in flight at once; None: every held-out prompt "
        "at once (the servers batch them and queue what exceeds their own limit).",
    )
    eval_fn: str | None = Field(
        None,
        description="(GRPO) Your evaluation, `module:function`, called as fn(engine, rows) -> dict of "
        "floats (plus tokenizer=, workflow=, version=, config= when it takes them) on the held-out rows, "
        "with no training episode in flight; None: the default evaluation from the workflow's "
        "reward_fn and the rows' answer field (eval/right, eval/exact, eval/format, eval/score: the "
        "mean reward, majority shares and collapse; docs/observability.md#held-out-evaluation). Its "
        "time is logged as timeperf/eval and not counted in total_train_seconds.",
    )
    answer_key: str = Field("answer", description="(default evaluation) The held-out rows' gold "
                            "answer field; rows without it get eval/score (the mean reward) only.")
    full_credit: float = Field(1.0, description="(default evaluation) A reply the reward pays at "
                               "least this is paid in full: exact (and its answer right).")
    pass_k: int | None = Field(None, ge=1, description="(default evaluation) Also sample pass_n "
                               "replies a held-out row at the training temperature and log "
                               "eval/pass@k (unbiased, of right; _exact: of exact). None: off.")
    pass_n: int | None = Field(None, ge=1, description="Samples a row for pass@k; None: pass_k.")
    rows_shown: int = Field(2, ge=0, description="(default evaluation) The best and the worst "
                            "this many held-out replies, logged at each evaluation.")

    @model_validator(mode="after")
    def _pass_n_covers_k(self) -> EvaluatorConfig:
        if self.pass_k and self.pass_n is not None and self.pass_n < self.pass_k:
            raise ValueError(f"evaluator.pass_n ({self.pass_n}) must be at least pass_k ({self.pass_k})")
        return self
    lm_eval: LMEvalConfig = Field(default_factory=LMEvalConfig, description="lm-eval tasks run with each evaluation.")


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
