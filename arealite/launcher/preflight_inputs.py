"""Checks before anything starts, on what the run reads: its data sets, the reward and eval
functions, the model folders, the context and the ports it binds. Each failure is one line
(``LaunchError``, exit status 2) within seconds, instead of a torchrun traceback minutes later.

The reward is called on the first rows of the training set with an empty completion (a legal
output of any model): a function that is missing, takes the wrong arguments, needs a field the
rows lack, or returns anything but a number fails here, named with the file and line of the row.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from arealite.api.config.experiment import BaseExperimentConfig, GRPOConfig, SFTConfig
from arealite.api.eval_api import load_eval_fn
from arealite.api.reward_api import as_reward
from arealite.api.workflow_factory import load_reward_fn
from arealite.dataset.loader import load_rows, local_file
from arealite.launcher.plan import LaunchError
from arealite.launcher.preflight import trainer_import_path
from arealite.utils.model_dir import is_hub_id, model_dir_problem
from arealite.utils.network import port_is_free

ROWS_CHECKED = 3
REWARD_CHECK_S = 10.0  # a reward slower than this on one row is left to run time, unchecked
_RESERVED = frozenset({"prompt", "completion", "prompt_ids", "completion_ids"})


def check_inputs(config: BaseExperimentConfig) -> None:
    """Raise ``LaunchError`` for the first input the run could not use."""
    check_models(config)
    rows = check_datasets(config)
    if isinstance(config, GRPOConfig):
        check_context(config)
        with trainer_import_path():  # the user's reward and grader, found as the trainer will
            check_reward(config, rows)
            check_eval_fn(config)
    check_ports(config)


def model_paths(config: BaseExperimentConfig) -> list[tuple[str, str]]:
    """(config key, path) of every model folder the trainer loads."""
    out = []
    for section in ("actor", "model", "ref", "critic"):
        engine = getattr(config, section, None)
        if engine is not None and getattr(engine, "path", ""):
            out.append((f"{section}.path", engine.path))
    return out


def check_models(config: BaseExperimentConfig) -> None:
    for key, path in model_paths(config):
        problem = model_dir_problem(path, key)
        if problem:
            raise LaunchError(problem)


def check_datasets(config: BaseExperimentConfig) -> list[tuple[str, dict[str, Any]]]:
    """Every local split parses; the first training rows as (``file:line``, row)."""
    first: list[tuple[str, dict[str, Any]]] = []
    for key in ("train_dataset", "valid_dataset"):
        ds = getattr(config, key, None)
        if ds is None or not ds.path:
            continue
        path = local_file(ds)
        if path is None:  # a hub data set: read (and checked) by `datasets` at run time
            continue
        if not path.is_file():
            raise LaunchError(f"{key}.path: dataset file not found: {path}")
        try:
            rows = load_rows(ds)
        except (ValueError, OSError, UnicodeDecodeError) as e:
            raise LaunchError(f"{key}.path: {e}") from None
        if not rows:
            raise LaunchError(f"{key}.path: {path} holds no rows")
        if key == "train_dataset":
            first = [(f"{path}:{_line_of(path, i)}", r) for i, r in enumerate(rows[:ROWS_CHECKED])]
        _check_fields(config, key, path, rows[:ROWS_CHECKED])
    return first


def _line_of(path: Path, index: int) -> int:
    """The line of the ``index``-th row of a JSONL file (blank lines skipped), else index + 1."""
    if path.suffix != ".jsonl":
        return index + 1
    seen = -1
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                seen += 1
                if seen == index:
                    return n
    return index + 1


def _check_fields(config: BaseExperimentConfig, key: str, path: Path,
                  rows: list[dict[str, Any]]) -> None:
    if isinstance(config, SFTConfig):
        need = [config.prompt_key, config.completion_key]
        if any("messages" in r or "input_ids" in r for r in rows):
            need = []
    else:  # an RL row's fields are the workflow's and the reward's: check_reward tries them
        need = []
    for i, r in enumerate(rows):
        missing = [k for k in need if k not in r]
        if missing:
            raise LaunchError(f"{key}: row {i + 1} of {path} has no field {missing[0]!r} "
                              f"(prompt_key/completion_key); its keys: {', '.join(r) or 'none'}")


def _max_context(path: str) -> int | None:
    """The model's context length from its config.json (a VL model's text part), if it says."""
    try:
        cfg = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    for c in (cfg, cfg.get("text_config") or {}):
        if isinstance(c.get("max_position_embeddings"), int):
            return c["max_position_embeddings"]
    return None


def check_context(config: GRPOConfig) -> None:
    if is_hub_id(config.actor.path):
        return
    limit = _max_context(config.actor.path)
    key = "max_position_embeddings"
    if config.servers.context_length is not None and (limit is None
                                                      or config.servers.context_length < limit):
        limit, key = config.servers.context_length, "the servers' context_length"
    if limit is None:
        return
    for name, g in (("gconfig", config.gconfig), ("eval_gconfig", config.eval_gconfig)):
        if g is not None and g.max_new_tokens >= limit:
            raise LaunchError(f"{name}.max_new_tokens={g.max_new_tokens} does not fit the "
                              f"model's context ({key}={limit} at actor.path={config.actor.path},"
                              " prompt included): lower it")


def check_reward(config: GRPOConfig, rows: list[tuple[str, dict[str, Any]]]) -> None:
    """The reward, imported as the trainer does, on the first rows with an empty completion."""
    if not config.workflow.reward_fn:
        return
    reward_kwargs = config.workflow.kwargs.get("reward_kwargs")
    try:
        fn = load_reward_fn(config.workflow.reward_fn, reward_kwargs)
    except Exception as e:  # noqa: BLE001 - an import or attribute error, one line either way
        raise LaunchError(f"workflow.reward_fn: {e}") from None
    for where, row in rows:
        prompt = row.get("prompt", row.get("question", ""))
        kwargs = {k: v for k, v in row.items() if k not in _RESERVED}
        error = _call_with_deadline(fn, (str(prompt), "", [], []), kwargs)
        if error:
            raise LaunchError(f"workflow.reward_fn {config.workflow.reward_fn} on the row at "
                              f"{where} (empty completion): {error}")


def _call_with_deadline(fn: Any, args: tuple, kwargs: dict[str, Any]) -> str | None:
    """The error of ``as_reward(fn(*args, **kwargs))`` in one line, None when it scored (or
    took longer than ``REWARD_CHECK_S``: a slow grader is not judged here)."""
    out: list[str | None] = []

    def call() -> None:
        try:
            as_reward(fn(*args, **kwargs))
            out.append(None)
        except Exception as e:  # noqa: BLE001 - the user's code: any error is the finding
            out.append(f"{type(e).__name__}: {e}".splitlines()[0])

    t = threading.Thread(target=call, daemon=True, name="preflight-reward")
    t.start()
    t.join(REWARD_CHECK_S)
    return out[0] if out else None


def check_eval_fn(config: GRPOConfig) -> None:
    if not config.evaluator.eval_fn:
        return
    try:
        load_eval_fn(config.evaluator.eval_fn)
    except Exception as e:  # noqa: BLE001 - missing attribute, wrong signature: one line
        raise LaunchError(str(e).splitlines()[0]) from None


def bound_ports(config: BaseExperimentConfig) -> list[tuple[str, int]]:
    """(config key, port) of every fixed port the run binds (0/None: picked free at start)."""
    out = []
    wu = getattr(config, "weight_update", None)
    if wu is not None and wu.master_port:
        out.append(("weight_update.master_port", wu.master_port))
    sl = config.stats_logger
    if sl.metrics_port:
        nproc = getattr(getattr(config, "launcher", None), "trainer_nproc", 1)
        out += [(f"stats_logger.metrics_port (+{r})" if r else "stats_logger.metrics_port",
                 sl.metrics_port + r) for r in range(nproc)]
    return out


def check_ports(config: BaseExperimentConfig) -> None:
    for key, port in bound_ports(config):
        if not port_is_free(port):
            raise LaunchError(f"{key}: port {port} is already in use on this host (another run's "
                              f"trainer or server?): pick a free one, or leave it unset")
