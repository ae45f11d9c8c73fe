"""Build the configured workflow: classes and reward functions named by import path
(``package.module:Name``), with errors that say what is wrong and where."""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import Any

from arealite.api.config.rollout import GenerationHyperparameters
from arealite.api.config.workflow import WorkflowConfig
from arealite.api.reward_api import check_reward_fn
from arealite.api.workflow_api import RolloutWorkflow


class WorkflowImportError(ImportError):
    """An import path in the workflow config does not name a usable object."""


def import_by_path(path: str, what: str = "object") -> Any:
    """``"package.module:Name"`` (or ``"package.module:Outer.Inner"``) -> the object."""
    if not isinstance(path, str) or path.count(":") != 1:
        raise WorkflowImportError(f"{what} path {path!r} must look like 'package.module:Name'")
    mod_name, attr = path.split(":")
    if not mod_name or not attr:
        raise WorkflowImportError(f"{what} path {path!r} must look like 'package.module:Name'")
    try:
        obj: Any = importlib.import_module(mod_name)
    except ModuleNotFoundError as e:
        raise WorkflowImportError(
            f"{what} path {path!r}: cannot import module {mod_name!r} ({e}); is its folder on "
            "PYTHONPATH (or the current directory)?"
        ) from e
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise WorkflowImportError(f"{what} path {path!r}: {obj.__name__ if hasattr(obj, '__name__') else obj!r} has no attribute {part!r}")
        obj = getattr(obj, part)
    return obj


def load_reward_fn(path: str, reward_kwargs: dict[str, Any] | None = None) -> Any:
    """Import a reward function; ``reward_kwargs`` are bound with ``functools.partial`` (a class
    is instantiated with them instead)."""
    obj = import_by_path(path, "reward_fn")
    if inspect.isclass(obj):
        obj = obj(**(reward_kwargs or {}))
    elif reward_kwargs:
        obj = functools.partial(obj, **reward_kwargs)
    check_reward_fn(obj)
    return obj


def build_workflow(
    config: WorkflowConfig,
    gconfig: GenerationHyperparameters,
    tokenizer: Any,
    **extra: Any,
) -> RolloutWorkflow:
    """Instantiate ``config.path`` with ``reward_fn``, ``gconfig``, ``tokenizer``, the config's
    ``kwargs`` and ``extra`` (``extra`` wins). Only arguments the class accepts are passed
    among ``reward_fn``/``gconfig``/``tokenizer``; an unknown kwarg is an error naming the
    accepted ones. ``kwargs["reward_kwargs"]`` configures the reward (see ``load_reward_fn``);
    an empty ``config.reward_fn`` lets the workflow use its own default reward (one that
    needs a reward function and has none is an error naming the key)."""
    if not config.path:  # the API names no workflow: the config must
        raise WorkflowImportError("workflow.path is not set: name the workflow class as "
                                  "package.module:ClassName (every configs/*.yaml does)")
    cls = import_by_path(config.path, "workflow")
    if not (inspect.isclass(cls) and issubclass(cls, RolloutWorkflow)):
        raise WorkflowImportError(f"workflow path {config.path!r} names {cls!r}, not a RolloutWorkflow subclass")
    kwargs = {**config.kwargs, **extra}
    reward_kwargs = kwargs.pop("reward_kwargs", None)
    if reward_kwargs is not None and not isinstance(reward_kwargs, dict):
        raise ValueError("workflow kwargs.reward_kwargs must be a mapping")
    params = inspect.signature(cls.__init__).parameters
    has_var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    standard: dict[str, Any] = {"gconfig": gconfig, "tokenizer": tokenizer}
    if config.reward_fn:
        standard["reward_fn"] = load_reward_fn(config.reward_fn, reward_kwargs)
    elif reward_kwargs:
        raise ValueError("reward_kwargs given but workflow.reward_fn is empty")
    for name, value in standard.items():
        if name in params or has_var_kw:
            kwargs.setdefault(name, value)
    wants = params.get("reward_fn")
    if wants is not None and wants.default is inspect.Parameter.empty and "reward_fn" not in kwargs:
        raise WorkflowImportError(f"workflow.reward_fn is not set, and {config.path} needs one: "
                                  "name the reward as package.module:function")
    if not has_var_kw:
        accepted = [n for n in params if n != "self"]
        unknown = sorted(set(kwargs) - set(accepted))
        if unknown:
            raise TypeError(f"{cls.__name__} does not accept {unknown}; it accepts {accepted}")
    try:
        return cls(**kwargs)
    except TypeError as e:
        raise TypeError(f"building {config.path} failed: {e}") from e
