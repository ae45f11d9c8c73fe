"""Load a config tree from YAML plus dotted ``key=value`` overrides, with readable errors."""

from __future__ import annotations

import difflib
import os
import sys
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from arealite.api.config.experiment import (
    BaseExperimentConfig,
    DPOConfig,
    GRPOConfig,
    RewardModelConfig,
    SFTConfig,
)
from arealite.api.config.servers import (
    LEGACY_SECTION,
    rename_legacy_override,
    rename_legacy_section,
    warn_legacy_section,
)
from arealite.api.workflow_factory import import_by_path

# experiment kind -> its config class (``kind:`` in a YAML file; the entry module is
# ``arealite.trainer.<kind>``)
CONFIG_CLASSES: dict[str, type[BaseExperimentConfig]] = {
    "grpo": GRPOConfig, "sft": SFTConfig, "dpo": DPOConfig, "reward_model": RewardModelConfig}

C = TypeVar("C", bound=BaseModel)


class ConfigError(ValueError):
    """A config file or override is wrong; the message names the key. CLIs exit with status 2."""


def _fields_at(cls: type[BaseModel], path: list[str]) -> list[str]:
    """Valid field names of the model found by walking ``path`` from ``cls`` (best effort)."""
    model: Any = cls
    for part in path:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        ann = field.annotation
        candidates = [ann, *getattr(ann, "__args__", ())]
        model = next(
            (c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None
        )
        if model is None:
            return []
    return list(getattr(model, "model_fields", {}))


def _format_validation_error(cls: type[BaseModel], err: ValidationError, prefix: str = "") -> str:
    """One line naming every bad key; ``prefix`` is where ``cls`` sits in the whole tree."""
    lines = []
    for e in err.errors():
        loc = [str(x) for x in e["loc"] if not str(x).startswith("function-after")]
        key = ".".join([prefix, *loc] if prefix else loc) or "<root>"
        if e["type"] == "extra_forbidden":
            valid = _fields_at(cls, loc[:-1])
            close = difflib.get_close_matches(loc[-1], valid, n=3, cutoff=0.5)
            hint = f" (did you mean: {', '.join(close)}?)" if close else ""
            lines.append(f"unknown key '{key}'{hint}")
        elif isinstance(e.get("input"), dict):  # a cross-field check of a whole section
            lines.append(f"invalid '{key}': {e['msg'].removeprefix('Value error, ')}")
        else:
            lines.append(f"bad value for '{key}': {e['msg']} (got {e.get('input')!r})")
    return "; ".join(lines)


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b.c=VALUE`` -> (["a","b","c"], VALUE parsed as YAML, so 1e-5, true, [1,2] work)."""
    if "=" not in item:
        raise ConfigError(f"override '{item}' is not of the form key=value")
    key, raw = item.split("=", 1)
    if not key or any(not p for p in key.split(".")):
        raise ConfigError(f"override '{item}' has an empty key part")
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"override '{item}': value is not valid YAML: {e}") from None
    return key.split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for item in overrides:
        path, value = parse_override(item)
        rename_legacy_override(path)  # sglang.x=... sets servers.x
        node = data
        for part in path[:-1]:
            nxt = node.get(part)
            if not isinstance(nxt, dict):
                nxt = {}
                node[part] = nxt
            node = nxt
        node[path[-1]] = value
    return data


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{p}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping")
    return data


def build_config(cls: type[C], data: dict[str, Any]) -> C:
    try:
        config = cls.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(cls, e)) from None
    schema = getattr(config, "extra_schema", None)
    if schema:
        config.extra = validate_extra(schema, config.extra)
    return config


def validate_extra(schema_path: str, extra: Any) -> BaseModel:
    """``extra`` checked by the user's model ``module:Class``, imported with the current folder
    on ``sys.path`` as ``torchrun -m`` has it, so the launcher and the trainer agree."""
    if isinstance(extra, BaseModel):
        extra = extra.model_dump()
    if not isinstance(extra, dict):
        raise ConfigError(f"'extra' must be a mapping, got {type(extra).__name__}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        model = import_by_path(schema_path, "extra_schema")
    except ImportError as e:
        raise ConfigError(str(e)) from None
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise ConfigError(f"extra_schema {schema_path!r} names {model!r}, not a pydantic model")
    if model.model_config.get("extra") != "allow":  # pydantic's default ignores unknown keys
        for key in extra:
            if key not in model.model_fields:
                close = difflib.get_close_matches(key, list(model.model_fields), n=3, cutoff=0.5)
                hint = f" (did you mean: {', '.join(close)}?)" if close else ""
                raise ConfigError(f"unknown key 'extra.{key}'{hint}")
    try:
        return model.model_validate(extra)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(model, e, prefix="extra")) from None


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    cls: type[BaseExperimentConfig] | None = None,
) -> BaseExperimentConfig:
    """Read YAML (optional), apply overrides, validate. The class comes from ``kind``
    (``grpo`` by default) unless given."""
    data = read_yaml(path) if path is not None else {}
    legacy = rename_legacy_section(data)
    overrides = list(overrides or [])
    legacy |= any(parse_override(o)[0][0] == LEGACY_SECTION for o in overrides)
    if legacy:  # one line, however many places still say it
        warn_legacy_section()
    data = apply_overrides(data, overrides)
    if cls is None:
        kind = data.get("kind", "grpo")
        if not isinstance(kind, str) or kind not in CONFIG_CLASSES:
            raise ConfigError(f"unknown kind '{kind}'; valid: {', '.join(CONFIG_CLASSES)}")
        cls = CONFIG_CLASSES[kind]
    return build_config(cls, data)


# Config fields holding an API key: printed as "***" (a real key never reaches a log).
SECRET_FIELDS = ("api_key", "admin_api_key")


def redact(data: Any) -> Any:
    """A copy of a config dump with every key field that is set masked as ``***``."""
    if isinstance(data, dict):
        return {k: ("***" if k in SECRET_FIELDS and v else redact(v)) for k, v in data.items()}
    if isinstance(data, list):
        return [redact(v) for v in data]
    return data


def to_yaml(config: BaseModel) -> str:
    """The config as YAML, keys masked (``redact``)."""
    return yaml.safe_dump(redact(config.model_dump(mode="json")), sort_keys=False)
