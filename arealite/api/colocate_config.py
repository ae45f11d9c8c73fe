"""``launcher.colocate``: the one switch between disaggregated async mode and co-located sync
mode. Before a GRPO config is validated, the switch sets what co-location implies, so the same
config file (and entry script, and workflows) runs either way:

- ``async_training: false``: servers and trainer take turns, so generation cannot run ahead;
- ``weight_update.type: tensor`` (a ``disk`` choice is kept; ``distributed`` becomes ``tensor``):
  weights move through shared memory on the host;
- ``launcher.n_servers = launcher.trainer_nproc``: one server per trainer rank.

A value the file set otherwise is overridden with a warning that names it.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("arealite.api.colocate_config")


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
