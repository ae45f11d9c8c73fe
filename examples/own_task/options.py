"""Our own options: the ``extra:`` section of own_task.yaml, validated by this model when the
config is loaded (``extra_schema: options:TaskOptions``); a typo is a one-line config error."""

from pydantic import BaseModel, ConfigDict, Field


class TaskOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    eval_rows: int = Field(32, ge=1, description="Held-out rows graded per evaluation.")
