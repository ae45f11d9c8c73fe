"""SGLang's wire types without its runtime (protocol section 9): ``sglang`` is installed with
``--no-deps``, so its package ``__init__`` cannot run; a namespace shim over the installed
folder lets ``sglang.api.v1.api_types`` import alone. The shim carries the real module spec, so
later ``importlib.util.find_spec("sglang")`` calls (TRL's, transformers') still see an installed
package rather than a module without a spec."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import Any


def load_api_types() -> Any | None:
    """``sglang.api.v1.api_types``, or None when sglang or msgspec is not installed."""
    if "sglang.api.v1.api_types" in sys.modules:
        return sys.modules["sglang.api.v1.api_types"]
    if "sglang" not in sys.modules:
        spec = importlib.util.find_spec("sglang")
        if spec is None or not spec.submodule_search_locations:
            return None
        if importlib.util.find_spec("msgspec") is None:
            return None
        shim = types.ModuleType("sglang")
        shim.__path__ = list(spec.submodule_search_locations)
        shim.__spec__ = spec
        sys.modules["sglang"] = shim
    try:
        return importlib.import_module("sglang.api.v1.api_types")
    except ImportError:
        return None
