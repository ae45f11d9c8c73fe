"""Checks before anything starts: every module the trainer will import by name must be
importable the way the trainer imports it, or the run stops with one line naming the module
and the fix (exit status 2), instead of torchrun's ``ChildFailedError`` traceback minutes later.

The trainer runs as ``torchrun -m ENTRY`` in the launcher's folder, so it sees ``PYTHONPATH``
and the current folder: the check looks at exactly those.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from arealite.api.config.experiment import BaseExperimentConfig
from arealite.launcher.plan import LaunchError, entry_module


def named_modules(config: BaseExperimentConfig) -> Iterator[tuple[str, str]]:
    """(config key, module name) of every module the trainer imports by name."""
    yield "launcher.entry_module", entry_module(config)
    workflow = getattr(config, "workflow", None)
    if workflow is not None:
        if not workflow.path:
            if config.launcher.entry_module is None:  # arealite's trainer builds the workflow
                raise LaunchError("workflow.path is not set: name the workflow class as "
                                  "package.module:ClassName (every configs/*.yaml does)")
        else:
            yield "workflow.path", workflow.path.split(":")[0]
        if workflow.reward_fn:
            yield "workflow.reward_fn", workflow.reward_fn.split(":")[0]
    if config.evaluator.eval_fn:
        yield "evaluator.eval_fn", config.evaluator.eval_fn.split(":")[0]


def _findable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package is missing or broken
        return False


def _holder(module: str, folders: list[Path]) -> Path | None:
    """The first of ``folders`` that holds ``module`` as a file or package."""
    rel = Path(*module.split("."))
    for folder in folders:
        if (folder / rel).with_suffix(".py").is_file() or (folder / rel).is_dir():
            return folder
    return None


def check_modules(config: BaseExperimentConfig, config_path: str | None) -> None:
    """Raise ``LaunchError`` for the first named module the trainer could not import."""
    cwd = Path.cwd()
    added = str(cwd) not in sys.path
    if added:  # `torchrun -m` puts the current folder first on the trainer's path
        sys.path.insert(0, str(cwd))
    importlib.invalidate_caches()  # files written since the last import (tests, notebooks)
    try:
        for key, module in named_modules(config):
            if _findable(module):
                continue
            hint = ["add its folder to PYTHONPATH"]
            config_dir = Path(config_path).resolve().parent if config_path else None
            where = _holder(module, [p for p in (config_dir,) if p is not None])
            if where is not None and where != cwd:
                hint = [f"run from {where} (it is there)", f"or PYTHONPATH={where}"]
            else:
                hint.append("or run from the folder that holds it")
            pp = os.environ.get("PYTHONPATH", "")
            raise LaunchError(
                f"{key}: module '{module}' is not importable from {cwd}"
                f"{f' with PYTHONPATH={pp}' if pp else ''}; {', '.join(hint)}"
            )
    finally:
        if added:
            sys.path.remove(str(cwd))


def check_context_parallel(config: BaseExperimentConfig) -> None:
    """Raise ``LaunchError`` when a model's ``context_parallel_size`` does not divide the
    trainer processes, or (a local model directory) its attention heads."""
    from arealite.api.config.actor import TrainEngineConfig

    nproc = config.launcher.trainer_nproc
    for name in type(config).model_fields:
        section = getattr(config, name)
        if not isinstance(section, TrainEngineConfig) or section.context_parallel_size == 1:
            continue
        cp = section.context_parallel_size
        if nproc % cp:
            raise LaunchError(f"{name}.context_parallel_size={cp} does not divide "
                              f"launcher.trainer_nproc={nproc}")
        cfg_file = Path(section.path) / "config.json"
        if cfg_file.is_file():
            import json

            heads = json.loads(cfg_file.read_text()).get("num_attention_heads", 0)
            if heads % cp:
                raise LaunchError(f"{name}.context_parallel_size={cp} does not divide the "
                                  f"model's {heads} attention heads ({section.path})")
