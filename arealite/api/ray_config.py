"""Settings of the Ray launcher (``python -m arealite.launcher.ray``): where servers and the
trainer go on a Ray cluster and what Ray does when a server dies. A section of
``launcher`` (``launcher.ray.*``); its own file because ``config.py`` is near its size limit."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class RayLauncherConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

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
