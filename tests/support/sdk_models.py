"""Strict checks of response bodies against the official SDKs' own pydantic models.

``Model.model_validate(body, strict=True)`` rejects a missing required field and any type
coercion (a float ``created``, a string number), but the SDKs' models allow extra keys
(``extra='allow'``), so it alone would pass a misspelt or invented field. ``validate`` also
walks the validated object and fails on any key the SDK's model does not declare, except the
documented extensions a route names (SGLang's ``matched_stop``, ``metadata``, ...).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, TypeAdapter


def _extras(obj: Any, path: str, out: list[str]) -> None:
    if isinstance(obj, BaseModel):
        for key in obj.model_extra or {}:
            out.append(f"{path}.{key}" if path else key)
        for name in type(obj).model_fields:
            _extras(getattr(obj, name), f"{path}.{name}" if path else name, out)
    elif isinstance(obj, (list, tuple)):
        for i, x in enumerate(obj):
            _extras(x, f"{path}[{i}]", out)
    elif isinstance(obj, dict):
        for k, x in obj.items():
            _extras(x, f"{path}[{k!r}]", out)


def undeclared(obj: Any) -> list[str]:
    """Paths of the keys no SDK model along the way declares (``choices[0].matched_stop``)."""
    out: list[str] = []
    _extras(obj, "", out)
    return out


def validate(model: Any, body: Any, allowed: tuple[str, ...] = ()) -> Any:
    """Validate ``body`` strictly as ``model`` (a pydantic model class or a type such as a
    discriminated union); every undeclared key's last name must be in ``allowed``."""
    if isinstance(model, type) and issubclass(model, BaseModel):
        obj = model.model_validate(body, strict=True)
    else:
        obj = TypeAdapter(model).validate_python(body, strict=True)
    extra = [p for p in undeclared(obj) if p.rsplit(".", 1)[-1].split("[")[0] not in allowed]
    assert not extra, f"keys the SDK's {getattr(model, '__name__', model)} does not declare: {extra}"
    return obj


def sse_events(raw: str) -> list[Any]:
    """The JSON payloads of a ``text/event-stream`` body (``[DONE]`` dropped)."""
    import json

    out = []
    for line in raw.splitlines():
        if line.startswith("data: ") and line[6:].strip() != "[DONE]":
            out.append(json.loads(line[6:]))
    return out
