"""The one seam between the client and a server backend's ``/generate`` wire format.

A backend is a ``GenerateProtocol``: the path requests go to, how one segment of a request is
encoded, and how an answer becomes a ``Segment``. ``RemoteInferenceEngine`` holds one (by default
``sglang_protocol.SGLANG``) and never builds a body or reads an answer itself, so another
backend (vLLM's native API, say) is one more module implementing these three members, never a
copy of the client. Routing, retries, resumption after a pause and versions stay in the client.

The same object names the backend's control calls (pause, resume, reload from disk, the
version report), which ``WeightSync``, the health probe and the weight verifier make through it:
``sglang_protocol.SGLANG`` (SGLang and our embedded servers) and ``vllm_protocol.VLLM``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from arealite.api.config.rollout import GenerationHyperparameters


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
    scores: list[float] | None = None  # a scoring backend's answer (``score_protocol``)
    # SGLang's ``meta_info.routed_experts`` decoded: flat int32 ids of rows ``[routed_start,
    # input + output - 1)``; None when the answer has none
    routed_experts: Any = None
    routed_start: int = 0


class GenerateProtocol(Protocol):
    """What the client needs from a backend. Implement the two functions as plain functions
    (``staticmethod``): the client calls them on its per-request hot path, where a wrapper
    would cost a frame per call."""

    name: str
    generate_path: str
    version_info: str  # GET /<version_info> answers {"weight_version": ...}
    continue_path: str  # POST after an update: resume generation
    update_session_paths: tuple[str, str] | None  # begin/end of an update (404 tolerated)
    required_endpoints: tuple[tuple[str, str], ...]  # (method, path) probed at start-up
    supports_broadcast: bool  # SGLang's /init_weights_update_group protocol
    # a distributed update over the backend's own transfer API: a factory of the client's
    # per-WeightSync half (vllm_transfer.VLLMTransfer), or None (SGLang's group, if supported)
    native_transfer: Callable[[], Any] | None
    weight_checksums: bool  # /weights_checker answers hashes comparable with the trainer's
    lora_paths: tuple[str, str]  # POST paths that load / unload a LoRA adapter by name

    def add_image_data(self, body: bytes, image_data: list[str]) -> bytes:
        """``body`` with a request's images (paths, file URLs or base64); ValueError where the
        backend's adapter takes none."""
        ...

    def pause_call(self, mode: str) -> tuple[str, dict[str, Any] | None]:
        """(path, JSON body or None) of the pause before an update (``pause_mode``)."""
        ...

    def disk_update_calls(
        self, path: str, version: int, flush: bool, abort_all: bool = False
    ) -> list[tuple[str, dict[str, Any]]]:
        """The POSTs, in order, that load the HF folder ``path`` as ``version``; raises
        ``ValueError`` when this backend cannot load that model in place."""
        ...

    def encode_generate_body(
        self, input_ids: list[int], g: GenerationHyperparameters, max_new_tokens: int,
        rid: str, generated: int = 0, ids_json: bytes | None = None, lora: str | None = None,
    ) -> bytes:
        """The JSON body of one segment: ``input_ids`` (prompt + tokens so far), at most
        ``max_new_tokens`` more, ``generated`` tokens already produced (for ``min_new_tokens``
        and the like), the server-side ``rid``; ``ids_json`` is ``input_ids`` already encoded;
        ``lora`` the name of the LoRA adapter to run on (None: the base model)."""
        ...

    def parse_generate_response(self, body: Any, fallback_version: int) -> Segment:
        """One decoded answer -> ``Segment``; raises ``ProtocolError`` on a malformed one.
        ``fallback_version`` is the version for tokens the server reports no integer for."""
        ...
