"""Figures printed by the benchmarks, parsed and rendered as ``docs/benchmarks.md``.

A benchmark states each headline figure on one line that ends with its target, e.g.::

    ratio server / static batch  : 2.31x (target >= 1.5x)
    upload fit: 12.0 ms fixed + 0.8 ms/MB; ... per-byte upload/copy = 1.4x (target <= 2x, fixed < 50 ms)

``parse_figures`` turns such lines into ``Figure`` rows: the value is the number right before
``(target``; a target clause with a name (``fixed < 50 ms``) is checked against the number
written before that name in the line (``12.0 ms fixed``). Pure functions, tested in
tests/benchmarks/harness/test_bench_report.py.
"""

from __future__ import annotations

import operator
import os
import platform
import re
from dataclasses import asdict, dataclass
from typing import Any

_NUM = r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
_OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt,
        "≥": operator.ge, "≤": operator.le}
_TARGET = re.compile(r"\(target:?\s+([^)]*)\)")
_CLAUSE = re.compile(rf"^\s*(?P<name>[A-Za-z][\w /.-]*?)?\s*(?P<op>>=|<=|≥|≤|>|<)\s*(?P<num>{_NUM})\s*(?P<unit>\S*)\s*$")


@dataclass
class Figure:
    benchmark: str
    name: str
    value: str
    target: str
    met: bool | None  # None: the target could not be checked from the line

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _check_clause(head: str, value: float, clause: str) -> bool | None:
    m = _CLAUSE.match(clause)
    if m is None:
        return None
    op, bound = _OPS[m["op"]], float(m["num"])
    name = (m["name"] or "").strip()
    if not name:
        return op(value, bound)
    # "fixed < 50 ms" is checked against "<number> [unit] fixed" in the line
    unit = re.escape(m["unit"]) if m["unit"] else r"\S*"
    hit = re.search(rf"({_NUM})\s*{unit}\s+{re.escape(name)}\b", head)
    return None if hit is None else op(float(hit.group(1)), bound)


def parse_figures(benchmark: str, text: str) -> list[Figure]:
    """Every ``... VALUE (target OP X[, NAME OP Y])`` line of ``text`` (also ``(target: ...)``).
    A target the parser cannot check (prose, a formula) gives ``met=None``; a ``(target ...)``
    with no number right before it is prose and is skipped."""
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        t = _TARGET.search(line)
        if t is None:
            continue
        head = line[: t.start()].rstrip()
        value_m = re.search(rf"({_NUM})\s*(x|%|s|ms)?\s*;?\s*$", head)
        if value_m is None:
            continue  # a target named in prose, not a figure
        value = float(value_m.group(1))
        label = head[: value_m.start()].rstrip(" :=")
        shown = value_m.group(0).strip(" ;")
        # a label that itself holds earlier figures ("a: 1.0; b = 2x, c") keeps only its last
        # part (commas inside parentheses belong to the label)
        label = re.split(r";\s*|,\s+(?![^()]*\))", label)[-1].strip() or label
        clauses = [c for c in t.group(1).split(",") if c.strip()]
        checks = [_check_clause(head, value, c) for c in clauses]
        met = None if not checks or any(c is None for c in checks) else all(checks)
        out.append(Figure(benchmark, label, shown, t.group(1).strip(), met))
    return out


def machine_info() -> dict[str, Any]:
    """CPU model, core count, torch and Python versions, OS: where a figure was measured."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import torch

        tv = torch.__version__
        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        tv, gpu = "not installed", None
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": tv, "gpu": gpu,
            "python": platform.python_version(), "os": f"{platform.system()} {platform.release()}"}


def machine_line(m: dict[str, Any]) -> str:
    gpu = f", GPU {m['gpu']}" if m.get("gpu") else ", no GPU"
    return f"{m['cpu']}, {m['cores']} cores{gpu}, torch {m['torch']}, Python {m['python']}, {m['os']}"


def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def _met(v: bool | None) -> str:
    return {True: "met", False: "**not met**", None: "n/a"}[v]


def render_markdown(
    results: list[dict[str, Any]],
    machine: dict[str, Any],
    command: str,
    sections: list[tuple[str, str]] | None = None,
    date: str = "",
) -> str:
    """``docs/benchmarks.md``. ``results``: one dict per benchmark with ``name``, ``command``,
    ``status`` (``ok``/``failed``/``missing``/``timeout``), ``seconds``, ``figures``
    (``Figure`` dicts) and ``notes`` (lines of informational output worth keeping).
    ``sections``: extra (title, markdown) pairs appended after the summary."""
    lines = ["# Benchmarks", "",
             f"Written by `{command}`" + (f" on {date}" if date else "") + ". Machine: "
             + machine_line(machine) + ".", "",
             "Every figure below comes from the benchmark's own printed output in this run "
             "(quick mode: fewer requests, rounds and steps than a full run). Reproduce one "
             "benchmark with the command in its section; `make bench` reruns them all.", "",
             "## Summary", "",
             "| benchmark | figure | value | target | status |", "|---|---|---|---|---|"]
    for r in results:
        if not r["figures"]:
            lines.append(f"| {r['name']} | - | - | - | {r['status']} |")
        for f in r["figures"]:
            lines.append(f"| {r['name']} | {_cell(f['name'])} | {_cell(f['value'])} | "
                         f"{_cell(f['target'])} | {_met(f['met'])} |")
    n_met = sum(1 for r in results for f in r["figures"] if f["met"] is True)
    n_all = sum(1 for r in results for f in r["figures"])
    lines += ["", f"{n_met} of {n_all} targets met."]
    for r in results:
        lines += ["", f"## {r['name']}", "",
                  f"Command: `{r['command']}` ({r['status']}"
                  + (f", {r['seconds']:.0f} s" if r.get("seconds") else "")
                  + (f", rerun on {r['date']}" if r.get("date", date) != date else "") + ")."]
        if r.get("about"):
            lines += ["", r["about"]]
        if r.get("notes"):
            lines += ["", "```", *r["notes"], "```"]
    for title, body in sections or []:
        lines += ["", f"## {title}", "", body.rstrip()]
    return "\n".join(lines) + "\n"
