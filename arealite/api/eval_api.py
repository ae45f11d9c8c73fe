"""The evaluation-hook contract (``evaluator.eval_fn``): ``eval_fn(engine, rows, *, tokenizer,
workflow, version, config) -> dict[str, float]``, any of the keywords left out. Here, below
both the trainer that calls it and the launcher that checks it before anything starts."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from arealite.api.workflow_factory import import_by_path

EvalFn = Callable[..., dict[str, float]]
CONTEXT_ARGS = ("tokenizer", "workflow", "version", "config")


def load_eval_fn(path: str | None) -> EvalFn | None:
    """``module:function`` -> the function (checked to take ``(engine, rows)``); None -> None."""
    if not path:
        return None
    fn = import_by_path(path, "evaluator.eval_fn")
    if not callable(fn):
        raise TypeError(f"evaluator.eval_fn {path!r} names {fn!r}, which is not callable")
    try:  # the context keywords are passed by name, so only they may be required besides
        inspect.signature(fn).bind(None, [], **{k: None for k in context_for(fn, dict.fromkeys(CONTEXT_ARGS))})
    except TypeError as e:
        raise TypeError(f"evaluator.eval_fn {path!r} must accept (engine, rows) and, by name, "
                        f"only {', '.join(CONTEXT_ARGS)}: {e}") from None
    return fn


def context_for(fn: EvalFn, context: dict[str, Any]) -> dict[str, Any]:
    """The context keywords ``fn`` declares (all of them when it takes ``**kwargs``)."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(context)
    return {k: v for k, v in context.items() if k in params}
