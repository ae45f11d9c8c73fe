"""The ``workflow`` section: the rollout workflow and its reward, named by import path. No
default names one (the API knows no workflow): the shipped configs (``configs/*.yaml``) say
which runs, and a run whose config names none stops with a config error."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from arealite.api.config.base import BaseConfig


class WorkflowConfig(BaseConfig):
    """The rollout workflow, named by import path (``package.module:ClassName``)."""

    path: str = Field(
        "", description="Workflow class import path, `package.module:ClassName`; required to "
        "train (every shipped config names one, e.g. `workflows.rlvr:RLVRWorkflow`): a run "
        "without it stops before anything starts.")
    reward_fn: str = Field(
        "", description="Reward function import path; empty: the workflow's own default "
        "reward (a workflow that takes a reward_fn and has none refuses to start).")
    kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra keyword arguments for the workflow. RLVRWorkflow takes "
        "apply_chat_template (default true: a `prompt`/`question` row becomes one user turn "
        "of the tokenizer's chat template; false tokenizes it as plain text; rows with "
        "`input_ids` are used as is), system_prompt, template_kwargs, reward_timeout, "
        "dump_dir and stop_on_pad (default true: the tokenizer's pad token stops a sample "
        "besides EOS, as AReaL's RLVR client sends; false when pad is an ordinary token).",
    )
