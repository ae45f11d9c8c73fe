"""Generate docs/config.md from the pydantic models, so the reference never drifts.

Run ``python -m arealite.cli.gen_config_docs > docs/config.md`` (``make docs``); a test checks
that the committed file is current.
"""

from __future__ import annotations

import re
import sys
import typing

from pydantic import BaseModel

from arealite.api.config.experiment import DPOConfig, GRPOConfig, RewardModelConfig, SFTConfig


def _models_in(annotation: typing.Any) -> list[type[BaseModel]]:
    out = []
    for a in (annotation, *typing.get_args(annotation)):
        if isinstance(a, type) and issubclass(a, BaseModel):
            out.append(a)
    return out


def _type_name(annotation: typing.Any) -> str:
    s = getattr(annotation, "__name__", None) if not typing.get_args(annotation) else None
    # a section's type by its class name alone, whichever module of the package defines it
    name = re.sub(r"arealite\.api\.config\.\w+\.", "", (s or str(annotation)).replace("typing.", ""))
    return name.replace("|", "\\|")


def _default(field) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is not None:
        v = field.default_factory()
        return "(section)" if isinstance(v, BaseModel) else f"`{v!r}`"
    return f"`{field.default!r}`"


def render() -> str:
    lines = [
        "# Configuration reference",
        "",
        "Generated from `arealite/api/config/` by `python -m arealite.cli.gen_config_docs`;",
        "do not edit by hand. Files live in `configs/*.yaml`; override any key on the command",
        "line as `section.key=value` (values parsed as YAML). `arealite config FILE [k=v ...]`",
        "prints the resolved tree; unknown keys and bad values exit with status 2.",
        "",
    ]
    seen: set[type] = set()
    queue: list[tuple[str, type[BaseModel]]] = [("GRPOConfig", GRPOConfig), ("SFTConfig", SFTConfig),
                                              ("DPOConfig", DPOConfig),
                                              ("RewardModelConfig", RewardModelConfig)]
    while queue:
        title, model = queue.pop(0)
        if model in seen:
            continue
        seen.add(model)
        lines += [f"## {title}", "", "| key | type | default | description |", "|---|---|---|---|"]
        for name, f in model.model_fields.items():
            lines.append(
                f"| `{name}` | {_type_name(f.annotation)} | {_default(f)} | {f.description or ''} |"
            )
            for sub in _models_in(f.annotation):
                if sub not in seen:
                    queue.append((sub.__name__, sub))
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(render())
