"""Reward for code generation: the fraction of a row's test cases the completion's Python passes.

The program runs in ``workflows.sandbox`` (separate process, namespaces where available, an
unprivileged uid, memory/CPU/process/output limits, a private temp directory, no network); see
that module for exactly what is enforced and what is not. A hostile completion costs only its
own limits and scores 0 (or the tests it passed before misbehaving).
"""

from __future__ import annotations

import re
from typing import Any

from workflows.sandbox import SandboxLimits, run_tests

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(completion: str) -> str | None:
    """The last fenced code block (```python ... ```), or None when there is none."""
    blocks = _FENCE.findall(completion)
    return blocks[-1] if blocks else None


def code_reward(
    prompt: str,
    completion: str,
    prompt_ids: list[int] | None = None,
    completion_ids: list[int] | None = None,
    *,
    tests: Any = None,
    input_output: Any = None,
    timeout_per_test: float = 2.0,
    memory_mb: int = 256,
    require_code_block: bool = False,
    allow_site_packages: bool = False,
    **row: Any,
) -> float:
    """Fraction of tests passed, in [0, 1].

    Test cases come from the dataset row: ``tests`` (our format, see
    ``workflows.sandbox.normalize_tests``) or ``input_output`` (APPS style). A row without tests
    is a data error and raises (the reward pool counts it and gives 0). Without a fenced block
    the whole completion is taken as code, unless ``require_code_block``. Solutions may import
    only the standard library unless ``allow_site_packages`` (then also this environment's
    site-packages; raise ``memory_mb`` for heavy ones such as numpy).
    """
    cases = tests if tests is not None else input_output
    if cases is None:
        raise ValueError("code_reward: the row has no `tests` or `input_output` field")
    code = extract_code(completion)
    if code is None:
        if require_code_block:
            return 0.0
        code = completion
    if not code.strip():
        return 0.0
    limits = SandboxLimits(timeout_per_test=float(timeout_per_test), memory_mb=int(memory_mb),
                           allow_site_packages=bool(allow_site_packages))
    return run_tests(code, cases, limits).fraction
