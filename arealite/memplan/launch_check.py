"""The launcher's question before it starts anything: does the run fit its GPUs?

``check_memory(config)`` returns None when the plan fits (or the check does not apply) and
raises ``MemoryRefused`` with one line otherwise: what needs how much, the largest term, and
the knob(s) that bring it under with their predicted peaks. Skipped at no cost (nothing
imported, nothing built) when ``launcher.memory_check`` is false, when the trainer runs on the
CPU (``device: cpu``, or ``auto`` on a machine without an NVIDIA driver), or in
``server_only`` mode.
"""

from __future__ import annotations

import os
from typing import Any

NVIDIA_DRIVER = "/proc/driver/nvidia/version"


class MemoryRefused(ValueError):
    """The plan does not fit: the message is the one line to print."""


def applies(config: Any) -> bool:
    lc = getattr(config, "launcher", None)
    if lc is None or not getattr(lc, "memory_check", True) or lc.mode == "server_only":
        return False
    if config.device == "cpu":
        return False
    return config.device == "cuda" or os.path.exists(NVIDIA_DRIVER)


def check_memory(config: Any, gpu_name: str | None = None) -> str | None:
    """None, or the plan's one-line summary when it fits; ``MemoryRefused`` when it does not."""
    if not applies(config):
        return None
    from arealite.memplan.gpus import find_gpu
    from arealite.memplan.knobs import refusal_line
    from arealite.memplan.memory_plan import gib, plan_config

    gpu = find_gpu(gpu_name or config.launcher.gpu)
    try:
        plan = plan_config(config, gpu)
    except Exception as e:  # noqa: BLE001 - a model the planner cannot run must not block a run
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return f"memory check skipped, the planner could not plan this run: {why}"
    if not plan.fits:
        raise MemoryRefused(refusal_line(plan, config) + "; launcher.memory_check=false skips "
                            "this check")
    what, peak = plan.worst()
    return f"memory plan: {what} peak {gib(peak)} of {gib(plan.usable)} usable on {gpu.name}"
