"""Where the benchmarks live and where their results go: one folder per benchmark under
``benchmarks/results/`` (``results_dir("vs_trl")`` -> ``benchmarks/results/vs_trl/``)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository
RESULTS = ROOT / "benchmarks" / "results"


def results_dir(benchmark: str) -> Path:
    """The folder of one benchmark's kept result files (its JSON, and its PNGs, not committed)."""
    return RESULTS / benchmark
