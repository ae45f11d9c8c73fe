"""vLLM's native token-in/token-out API as a ``GenerateProtocol`` (``VLLM`` at the bottom), and
the control calls a weight update makes on a vLLM server.

Checked against vLLM 0.32's own source (``vllm/entrypoints/scale_out/token_in_token_out`` and
``vllm/entrypoints/rl/online/api_router.py``):

- ``POST /inference/v1/generate`` (served with ``--enable-scale-out``): ``token_ids``,
  ``request_id``, ``sampling_params`` (vLLM's ``SamplingParams``: ``max_tokens``, ``logprobs``
  0 = the sampled token's logprob only, ``min_tokens`` ...), ``output_mode: "tokens"``. The
  answer's ``choices[0]`` has ``token_ids``, ``logprobs.content[i].logprob``, ``finish_reason``
  (``stop``, ``length``, ``abort``, ``repetition``) and ``weight_versions``: spans
  ``[{"version", "start", "end"}]`` over output tokens, the same shape SGLang's ``meta_info``
  has, so per-token versions are the server's own report (``sglang_protocol.token_versions``).
- Logprobs follow ``docs/protocol.md`` (``log_softmax(logits / T)``) when the server runs with
  ``--logprobs-mode processed_logprobs`` (the launcher passes it): vLLM's default
  (``raw_logprobs``) ignores the temperature. vLLM's "processed" logprobs are taken after
  top-k / top-p / min-p filtering, so they equal the convention only without filtering
  (``top_k=-1``, ``top_p=1``, ``min_p=0``, as the shipped configs sample).
- With ``VLLM_SERVER_DEV_MODE=1``: ``POST /pause?mode=abort|wait|keep`` (query parameters, no
  body; ``abort`` ends in-flight requests with ``finish_reason: abort`` and their partial
  tokens), ``POST /resume``, ``GET /weight_info`` -> ``{"weight_version"}``,
  ``POST /update_weight_version`` ``{"new_version"}``, and ``POST /collective_rpc``
  ``{"method": "reload_weights", "kwargs": {"weights_path": DIR}}`` (in-place reload).
"""

from __future__ import annotations

import base64
import io
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from arealite.api.config.rollout import GenerationHyperparameters
from arealite.api.io_struct import token_ids_json
from arealite.backends.base import ProtocolError, Segment
from arealite.backends.sglang import token_versions
from arealite.backends.vllm.weight_transfer import VLLMTransfer

# SGLang pause modes -> vLLM's: "in_place" keeps requests in the batch (vLLM "keep");
# "retract" recomputes their KV cache after the update, as the client's resubmission of an
# aborted request with its partial tokens does.
PAUSE_MODES = {"abort": "abort", "retract": "abort", "in_place": "keep"}
# vLLM's finish reasons -> the client's; "repetition" (repetition detection) is a stop.
FINISH = {"stop": "stop", "length": "length", "abort": "abort", "repetition": "stop"}
# Endpoints the client needs, probed once per server at start-up (``check_server``).
REQUIRED_ENDPOINTS = (("GET", "/weight_info"), ("GET", "/is_paused"),
                      ("POST", "/inference/v1/generate"))  # {} -> 400, absent -> 404
_NEG_INF = -math.inf


def sampling_params(
    g: GenerationHyperparameters, max_new_tokens: int, generated: int = 0
) -> dict[str, Any]:
    """vLLM ``SamplingParams`` for one segment (``generated``: tokens of earlier segments)."""
    p: dict[str, Any] = {
        "max_tokens": int(max_new_tokens),
        "temperature": 0.0 if g.greedy else float(g.temperature),
        "top_p": float(g.top_p),
        "top_k": int(g.top_k),
        "min_p": float(g.min_p),
        "ignore_eos": bool(g.ignore_eos),
        "logprobs": 0,  # the sampled token's logprob only
        "detokenize": bool(g.stop),  # stop strings need text; tokens alone are faster
    }
    if g.frequency_penalty:
        p["frequency_penalty"] = float(g.frequency_penalty)
    remaining_min = g.min_new_tokens - generated
    if remaining_min > 0:
        p["min_tokens"] = min(int(remaining_min), int(max_new_tokens))
    if g.stop_token_ids:
        p["stop_token_ids"] = [int(t) for t in g.stop_token_ids]
    if g.stop:
        p["stop"] = list(g.stop)
    return p


def encode_generate_body(
    input_ids: list[int], g: GenerationHyperparameters, max_new_tokens: int, rid: str,
    generated: int = 0, ids_json: bytes | None = None, lora: str | None = None,
) -> bytes:
    """The JSON body of one ``/inference/v1/generate`` call; ``lora``: the LoRA adapter it runs
    on (vLLM picks a loaded adapter by the request's ``model``)."""
    if ids_json is None:
        ids_json = token_ids_json(input_ids)
    rest = json.dumps({
        "request_id": rid, "output_mode": "tokens", "stream": False,
        "sampling_params": sampling_params(g, max_new_tokens, generated),
        **({"model": lora} if lora is not None else {}),
    })
    if ids_json is None:  # not plain ints: let json check them
        return json.dumps({"token_ids": list(input_ids), **json.loads(rest)}).encode()
    return b'{"token_ids":' + ids_json + b"," + rest[1:].encode()


def parse_generate_response(body: Any, fallback_version: int) -> Segment:
    """One non-streamed answer -> ``Segment`` (a missing logprob -> -inf)."""
    try:
        choice = body["choices"][0]
        ids = choice["token_ids"]
    except (KeyError, IndexError, TypeError):
        raise ProtocolError(f"not a vLLM /inference/v1/generate answer: {str(body)[:300]}") from None
    if type(ids) is not list:
        raise ProtocolError("answer has no token_ids list")
    content = (choice.get("logprobs") or {}).get("content")
    if content is None:
        raise ProtocolError("answer has no logprobs (sampling_params.logprobs was sent)")
    n = len(ids)
    if len(content) != n:
        raise ProtocolError(f"{len(content)} logprob entries for {n} output tokens")
    try:
        logprobs = [_NEG_INF if e["logprob"] is None else float(e["logprob"]) for e in content]
        bad = next((i for i, e in enumerate(content) if e["token_id"] != ids[i]), None)
    except (KeyError, TypeError, ValueError) as e:
        raise ProtocolError(f"logprob entries must be {{token_id, logprob}}: {e}") from None
    if bad is not None:
        raise ProtocolError(f"logprob entry {bad} is for token {content[bad]['token_id']}, "
                            f"output has {ids[bad]}")
    reason = choice.get("finish_reason")
    kind = FINISH.get(reason)
    if kind is None:
        raise ProtocolError(f"unknown finish_reason {reason!r}")
    spans = choice.get("weight_versions")
    version = spans[-1].get("version") if type(spans) is list and spans else None
    meta = {"weight_versions": spans, "weight_version": version}
    seg = Segment(ids, logprobs, token_versions(meta, n, fallback_version), kind,
                  str(choice.get("stop_reason") or ""), version)
    if choice.get("routed_experts") is not None:
        seg.routed_experts = decode_npy_routed_experts(choice["routed_experts"])
    return seg


def decode_npy_routed_experts(value: Any) -> np.ndarray:
    """vLLM's ``choices[0].routed_experts``: base64 of ``.npy`` bytes of a
    ``[tokens - 1, num_layers, top_k]`` array (uint8, uint16 or int32), every row from the
    first token (vLLM's generate API has no start); flat int32 here, as SGLang's."""
    try:
        arr = np.load(io.BytesIO(base64.b64decode(value, validate=True)), allow_pickle=False)
    except (ValueError, TypeError, OSError) as e:
        raise ProtocolError(f"routed_experts is not base64 .npy bytes: {e}") from None
    if arr.ndim != 3 or arr.dtype.kind not in "iu":
        raise ProtocolError(f"routed_experts must be an integer [tokens, layers, top_k] array, "
                            f"got {arr.dtype} {arr.shape}")
    return arr.astype(np.int32).reshape(-1)


def tied_embeddings(model_path: str) -> bool:
    """Whether the HF model at ``model_path`` ties ``lm_head`` to the input embeddings."""
    try:
        cfg = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return False  # not a local HF folder: vLLM reports its own error
    return bool(cfg.get("tie_word_embeddings", cfg.get("text_config", {}).get(
        "tie_word_embeddings", False)))


TIED_MESSAGE = (
    "{path}: tie_word_embeddings is true, and vLLM's in-place reload (reload_weights) leaves a "
    "tied lm_head stale (its logprobs would be wrong by up to 14 nats): serve an untied model "
    "on vLLM (tie_word_embeddings: false, lm_head saved), or use the embedded/SGLang backend"
)


class VLLMProtocol:
    """vLLM's native API (a ``GenerateProtocol``), plus the control calls ``WeightSync``,
    the health probe and the start-up check make (``SGLangProtocol`` has the same members)."""

    name = "vllm"
    generate_path = "/inference/v1/generate"
    encode_generate_body = staticmethod(encode_generate_body)
    parse_generate_response = staticmethod(parse_generate_response)

    @staticmethod
    def add_routed_experts_start(body: bytes, start: int) -> bytes:
        """vLLM's generate API has no start: it reports every row, and the client keeps the
        rows it holds (``arealite.rollout.routed_experts``)."""
        return body

    @staticmethod
    def add_image_data(body: bytes, image_data: list[str]) -> bytes:
        raise ValueError("the vLLM backend adapter does not send images (image_data); "
                         "use the SGLang protocol (embedded or SGLang servers) for image prompts")
    version_info = "weight_info"  # GET /weight_info -> {"weight_version": "3"}
    continue_path = "/resume"
    update_session_paths = None  # no begin/end of an update
    required_endpoints = REQUIRED_ENDPOINTS
    weight_checksums = False  # /weights_checker hashes comparable with the trainer's
    supports_broadcast = False  # vLLM's weight transfer engine is not SGLang's group protocol
    native_transfer = VLLMTransfer  # distributed updates: vLLM's NCCL weight-transfer API
    # LoRA pushes (load, unload): vLLM serves them with --enable-lora and
    # VLLM_ALLOW_RUNTIME_LORA_UPDATING=True
    lora_paths = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")

    @staticmethod
    def pause_call(mode: str) -> tuple[str, dict[str, Any] | None]:
        return f"/pause?mode={PAUSE_MODES.get(mode, 'abort')}", None

    @staticmethod
    def disk_update_calls(path: str, version: int, flush: bool,
                          abort_all: bool = False) -> list[tuple[str, dict[str, Any]]]:
        """Reload in place from ``path``, then label the weights ``version``. Raises
        ``ValueError`` for tied embeddings (the reload would leave ``lm_head`` stale)."""
        if tied_embeddings(path):
            raise ValueError(TIED_MESSAGE.format(path=path))
        return [("/collective_rpc", {"method": "reload_weights",
                                     "kwargs": {"weights_path": str(path)}}),
                ("/update_weight_version", {"new_version": str(version)})]


VLLM = VLLMProtocol()
