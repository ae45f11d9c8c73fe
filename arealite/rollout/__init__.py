"""The client side, whole: ``RemoteInferenceEngine`` (``remote_engine``: generation, routing and
failover over the server pool; its trainer half, the version clock, the event loop and the
executor, is ``rollout_control``), the workflow executor and its staleness gate (``executor``,
``staleness``, ``data_cycle``, ``loop_thread``), routing and health (``router``, ``health``).
The /generate wire format is the backend's (``arealite.backends``), the weight transports are
the weights room's (``arealite.weights``). The trainer side is ``arealite.engine``; neither
imports the other.

``from arealite.rollout import RemoteSGLangEngine`` is the client under the name the design (and
AReaL) gives it; the class is named for what it is, since it speaks vLLM's protocol too. Loaded
on first use, so importing a module of this package does not load the client.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RemoteInferenceEngine", "RemoteSGLangEngine"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from arealite.rollout.remote_engine import RemoteInferenceEngine

        return RemoteInferenceEngine
    raise AttributeError(f"module 'arealite.rollout' has no attribute {name!r}")
