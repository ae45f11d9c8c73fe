"""Figures parsed from benchmark output and the docs/benchmarks.md rendering."""

from __future__ import annotations

import pytest

from benchmarks.harness.report import machine_info, machine_line, parse_figures, render_markdown

SERVER_OUT = """\
model=/tmp/x requests=16 new_tokens total=400 median=20 max=128 threads=1
round 0: server (continuous batching)        901.2 tokens/s
ratio server / one-at-a-time : 6.10x (target >= 5x)
ratio server / static batch  : 1.21x (target >= 1.5x)
"""
CLIENT_OUT = ("  overhead ratio raw/engine:    1.050x  (target <= 1.15); client CPU ratio 1.210x\n")
WEIGHT_OUT = ("upload fit: 12.0 ms fixed + 0.800 ms/MB; bare gloo 0.500 ms/MB; copy 0.400 ms/MB; "
              "per-byte upload/copy = 2.0x (target <= 2x, fixed < 50 ms)\n"
              "upload fit: 70.0 ms fixed + 0.800 ms/MB; per-byte upload/copy = 1.5x (target <= 2x, fixed < 50 ms)\n")


def test_parse_server_lines():
    figs = parse_figures("server_throughput", SERVER_OUT)
    assert [(f.name, f.value, f.target, f.met) for f in figs] == [
        ("ratio server / one-at-a-time", "6.10x", ">= 5x", True),
        ("ratio server / static batch", "1.21x", ">= 1.5x", False),
    ]
    assert all(f.benchmark == "server_throughput" for f in figs)


def test_parse_value_before_target_and_trailing_text():
    (f,) = parse_figures("client_overhead", CLIENT_OUT)
    assert (f.name, f.value, f.met) == ("overhead ratio raw/engine", "1.050x", True)


def test_named_clause_is_checked_against_its_own_number():
    ok, bad = parse_figures("weight_sync", WEIGHT_OUT)
    assert ok.name == "per-byte upload/copy" and ok.value == "2.0x" and ok.met is True
    assert bad.value == "1.5x" and bad.met is False  # 70 ms fixed breaks "fixed < 50 ms"


@pytest.mark.parametrize("line, met", [
    ("speedup: 0.63x (target >= 2.8x)", False),
    ("speedup: 3.10x (target >= 2.8x)", True),
    ("overlap efficiency (async-eta2): 0.95 (target >= 0.9)", True),
    ("latency: 49 ms (target < 50 ms)", True),
    ("latency: 50 ms (target < 50 ms)", False),
    ("something: 3 (target about 2)", None),  # a target that cannot be checked
    ("a = 18.4x, upload/bare = 2.64x (target: upload <= 2x copy + < 50 ms fixed)", None),
    ("eff (a, b): 0.5 (target: >= 0.9)", False),
])
def test_targets(line, met):
    (f,) = parse_figures("b", line)
    assert f.met is met


def test_lines_without_target_or_value_are_ignored():
    text = ("tokens/s 123.0\n(targets are listed below)\n"
            "upload/bare-b is our code's overhead (target <= ~1.3); bare/copy is the rest.\n")
    assert parse_figures("b", text) == []


def test_labels_keep_only_the_last_figure_name():
    (f,) = parse_figures("b", "fit: 1 ms; per-byte a/b = 18.4x, upload/bare = 2.64x (target <= 3x)")
    assert (f.name, f.value, f.met) == ("upload/bare", "2.64x", True)
    (g,) = parse_figures("b", "overlap efficiency (async-eta2, eta 2): 0.95 (target >= 0.9)")
    assert g.name == "overlap efficiency (async-eta2, eta 2)"


def test_render_markdown():
    figs = [f.as_dict() for f in parse_figures("server_throughput", SERVER_OUT)]
    results = [
        {"name": "server_throughput", "command": "python -m benchmarks.micro.server_throughput --quick",
         "status": "ok", "seconds": 12.3, "figures": figs, "notes": ["a | b"], "about": "What."},
        {"name": "packing", "command": "python -m benchmarks.packing", "status": "missing",
         "seconds": 0.0, "figures": [], "notes": [], "about": ""},
    ]
    machine = {"cpu": "AMD EPYC", "cores": 2, "torch": "2.13.0+cpu", "gpu": None,
               "python": "3.11.7", "os": "Linux 6"}
    md = render_markdown(results, machine, "make bench", [("Extra", "body text")], date="2026-01-01")
    assert md.startswith("# Benchmarks\n")
    assert "AMD EPYC, 2 cores, no GPU, torch 2.13.0+cpu" in md
    assert "Written by `make bench` on 2026-01-01" in md
    assert "| server_throughput | ratio server / one-at-a-time | 6.10x | >= 5x | met |" in md
    assert "| server_throughput | ratio server / static batch | 1.21x | >= 1.5x | **not met** |" in md
    assert "| packing | - | - | - | missing |" in md
    assert "1 of 2 targets met." in md
    assert "Command: `python -m benchmarks.micro.server_throughput --quick` (ok, 12 s)." in md
    assert "```\na | b\n```" in md  # notes verbatim in a code block
    assert md.rstrip().endswith("body text")


def test_machine_info_has_the_basics():
    m = machine_info()
    assert m["cores"] >= 1 and m["torch"] and m["cpu"]
    assert str(m["cores"]) in machine_line(m)
