"""The one seam between the client and a server backend's ``/generate`` wire format.

A backend is a ``GenerateProtocol``: the path requests go to, how one segment of a request is
encoded, and how an answer becomes a ``Segment``. ``RemoteSGLangEngine`` holds one (by default
``sglang_protocol.SGLANG``) and never builds a body or reads an answer itself, so another
backend (vLLM's native API, say) is one more module implementing these three members, never a
copy of the client. Routing, retries, resumption after a pause and versions stay in the client.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from arealite.api.config import GenerationHyperparameters


class ProtocolError(RuntimeError):
    """A server's answer does not have the shape the protocol promises."""


@dataclass(slots=True)
class Segment:
    """The outcome of one ``/generate`` call."""

    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish_type: str = "stop"  # "length", "stop" or "abort" (cut by a pause: resumed)
    finish_message: str = ""
    weight_version: str | None = None


class GenerateProtocol(Protocol):
    """What the client needs from a backend. Implement the two functions as plain functions
    (``staticmethod``): the client calls them on its per-request hot path, where a wrapper
    would cost a frame per call."""

    generate_path: str

    def encode_generate_body(
        self, input_ids: list[int], g: GenerationHyperparameters, max_new_tokens: int,
        rid: str, generated: int = 0, ids_json: bytes | None = None,
    ) -> bytes:
        """The JSON body of one segment: ``input_ids`` (prompt + tokens so far), at most
        ``max_new_tokens`` more, ``generated`` tokens already produced (for ``min_new_tokens``
        and the like), the server-side ``rid``; ``ids_json`` is ``input_ids`` already encoded."""
        ...

    def parse_generate_response(self, body: Any, fallback_version: int) -> Segment:
        """One decoded answer -> ``Segment``; raises ``ProtocolError`` on a malformed one.
        ``fallback_version`` is the version for tokens the server reports no integer for."""
        ...
