"""``/generate`` request bodies and response parsing, per ``docs/protocol.md`` (sections 3-4):
the ``GenerateProtocol`` (``arealite.backends.base``) of SGLang and of our embedded servers,
``SGLANG`` at the bottom.

Pure functions, no I/O: the engine builds a body per segment of a request and turns each answer
into a ``Segment`` (tokens, logprobs, per-token versions, finish reason).

Versions: a server's ``weight_version`` is the integer version as text. Servers launched
without ``--weight-version`` report ``"default"``; any version string that is not an integer is
read as the *engine's version when the request started* (the caller passes it as
``fallback``). Per-token versions come from ``meta_info.weight_versions`` spans
(``[{"version", "start", "end"}]`` over output-token indices); without spans every token gets
``meta_info.weight_version``.
"""

from __future__ import annotations

import base64
import json
import math
from json.encoder import encode_basestring_ascii
from typing import Any

import numpy as np

from arealite.api.config.rollout import GenerationHyperparameters
from arealite.api.io_struct import token_ids_json
from arealite.backends.base import ProtocolError, Segment

# Every key SGLang's /generate contract accepts inside ``sampling_params`` (protocol 3.2,
# ``api_types.SamplingParams``); the server rejects any other key with a 400.
SAMPLING_KEYS = frozenset(
    {
        "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p",
        "top_k", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty",
        "min_new_tokens", "n", "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos",
        "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim",
        "stream_interval", "logit_bias", "sampling_seed", "custom_params", "beam_width",
        "watermark", "choice",
    }
)

FINISH_TYPES = ("length", "stop", "abort")
_NEG_INF = -math.inf


def _optional_sampling(
    g: GenerationHyperparameters, max_new_tokens: int, generated: int
) -> dict[str, Any]:
    """The sampling keys sent only when used (most requests have none)."""
    p: dict[str, Any] = {}
    if g.frequency_penalty:
        p["frequency_penalty"] = float(g.frequency_penalty)
    remaining_min = g.min_new_tokens - generated
    if remaining_min > 0:  # min_new_tokens needs a server tokenizer: only sent when used
        p["min_new_tokens"] = min(int(remaining_min), int(max_new_tokens))
    if g.stop_token_ids:
        p["stop_token_ids"] = [int(t) for t in g.stop_token_ids]
    if g.stop:
        p["stop"] = list(g.stop)
    for key in ("json_schema", "regex", "ebnf"):
        if getattr(g, key) is not None:
            p[key] = getattr(g, key)
    return p


def sampling_params(
    g: GenerationHyperparameters, max_new_tokens: int, generated: int = 0
) -> dict[str, Any]:
    """SGLang ``sampling_params`` for one segment: ``max_new_tokens`` is what is left of the
    request, ``generated`` the tokens already produced by earlier segments (for min tokens)."""
    p: dict[str, Any] = {
        "max_new_tokens": int(max_new_tokens),
        # SGLang: 0 <= t < 1e-6 is greedy (top_k 1); logprobs are then log_softmax(logits).
        "temperature": 0.0 if g.greedy else float(g.temperature),
        "top_p": float(g.top_p),
        "top_k": int(g.top_k),
        "min_p": float(g.min_p),
        "ignore_eos": bool(g.ignore_eos),
    }
    p.update(_optional_sampling(g, max_new_tokens, generated))
    # Every key above is in SAMPLING_KEYS (a server 400s any other): checked by the unit tests
    # with every optional field set, not here on every request.
    return p


def generate_payload(
    input_ids: list[int],
    g: GenerationHyperparameters,
    max_new_tokens: int,
    rid: str,
    generated: int = 0,
    lora: str | None = None,
) -> dict[str, Any]:
    """The JSON body of one ``/generate`` call (token ids in, logprobs of output tokens out);
    ``lora``: the LoRA adapter it runs on (SGLang's ``lora_path`` holds the adapter's name)."""
    body = {
        "input_ids": input_ids,
        "sampling_params": sampling_params(g, max_new_tokens, generated),
        "return_logprob": True,
        "logprob_start_len": -1,  # output tokens only
        "stream": False,
        "rid": rid,
    }
    if lora is not None:
        body["lora_path"] = lora
    if g.return_routed_experts:
        body["return_routed_experts"] = True
    return body


# ``generate_payload`` as bytes, for the client's hot path. ``json.dumps`` has a fixed cost of a
# few microseconds per call, which dominates a short body (~5 us for a 32-token prompt); the
# ids come already encoded (``token_ids_json``) and the repr of a finite float is JSON, so
# formatting costs a fraction of that. ``encode_generate_body`` falls back to ``json.dumps``
# for anything else.
_BODY = (
    b'{"input_ids":%b,"sampling_params":{"max_new_tokens":%d,"temperature":%r,"top_p":%r,'
    b'"top_k":%d,"min_p":%r,"ignore_eos":%b%b},"return_logprob":true,"logprob_start_len":-1,'
    b'"stream":false,"rid":%b}'
)


def encode_generate_body(
    input_ids: list[int],
    g: GenerationHyperparameters,
    max_new_tokens: int,
    rid: str,
    generated: int = 0,
    ids_json: bytes | None = None,
    lora: str | None = None,
) -> bytes:
    """``json.dumps(generate_payload(...))`` as UTF-8 bytes, faster: the same JSON value.

    ``ids_json``: ``input_ids`` already as JSON (``ModelRequest.validate`` returns it).
    """
    if ids_json is None:
        ids_json = token_ids_json(input_ids)
    temperature = 0.0 if g.greedy else float(g.temperature)
    top_p, min_p = float(g.top_p), float(g.min_p)
    if (
        ids_json is None
        or type(max_new_tokens) is not int
        or type(g.top_k) is not int
        or not math.isfinite(temperature + top_p + min_p)
    ):
        return json.dumps(generate_payload(input_ids, g, max_new_tokens, rid, generated,
                                           lora)).encode()
    optional = _optional_sampling(g, max_new_tokens, generated)
    body = _BODY % (
        ids_json, max_new_tokens, temperature, top_p, g.top_k, min_p,
        b"true" if g.ignore_eos else b"false",
        b"," + json.dumps(optional)[1:-1].encode() if optional else b"",
        encode_basestring_ascii(rid).encode(),
    )
    if g.return_routed_experts:
        body = body[:-1] + b',"return_routed_experts":true}'
    if lora is not None:
        return body[:-1] + b',"lora_path":' + encode_basestring_ascii(lora).encode() + b"}"
    return body


def add_routed_experts_start(body: bytes, start: int) -> bytes:
    """``body`` asking only for routed-expert rows from ``start`` on (SGLang's
    ``routed_experts_start_len``): a resumed segment's earlier rows are already held."""
    return body[:-1] + b',"routed_experts_start_len":%d}' % int(start)


def add_image_data(body: bytes, image_data: list[str]) -> bytes:
    """``body`` (a JSON object) with SGLang's ``image_data``: one prompt's list of images."""
    if not body.endswith(b"}"):
        raise ValueError("a /generate body must be a JSON object")
    return body[:-1] + b',"image_data":' + json.dumps(list(image_data)).encode() + b"}"


def encode_batch_body(
    ids_jsons: list[bytes], g: GenerationHyperparameters, max_new_tokens: int, rids: list[str]
) -> bytes:
    """One SGLang batch ``/generate`` body for several prompts sampled alike (a GRPO group):
    ``input_ids`` a list of lists (each item already JSON), one ``sampling_params`` dict that
    SGLang applies to every item, and a list of distinct ``rid``s; the answer is a list in the
    same order (protocol 3.3-3.4). Only first segments go this way (``generated`` is 0)."""
    return (b'{"input_ids":[' + b",".join(ids_jsons) + b'],"sampling_params":'
            + json.dumps(sampling_params(g, max_new_tokens)).encode()
            + b',"return_logprob":true,"logprob_start_len":-1,"stream":false,"rid":'
            + json.dumps(rids).encode()
            + (b',"return_routed_experts":true}' if g.return_routed_experts else b"}"))


def parse_batch_response(body: Any, n: int, fallback_version: int) -> list[Segment]:
    """A batch ``/generate`` answer (a list of ``n`` results, in request order) -> Segments."""
    if type(body) is not list or len(body) != n:
        got = f"a list of {len(body)}" if isinstance(body, list) else type(body).__name__
        raise ProtocolError(f"expected a list of {n} results, got {got}")
    return [parse_generate_response(item, fallback_version) for item in body]


def parse_version(value: Any, fallback: int) -> int:
    """``"3"`` -> 3; ``"default"``, None or anything non-integer -> ``fallback``."""
    if type(value) is str:  # what servers send; int() ignores surrounding whitespace
        try:
            return int(value)
        except ValueError:
            return fallback
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return fallback


def token_versions(meta: dict[str, Any], n_tokens: int, fallback: int) -> list[int]:
    """One version per output token, from the spans, else from ``weight_version``.

    A span list that does not cover ``[0, n_tokens)`` (an older or partial answer) has its gaps
    filled with ``weight_version``: the server's own report is still better than a guess.
    """
    spans = meta.get("weight_versions")
    if type(spans) is list and len(spans) == 1:  # the common case: one span over every token
        sp = spans[0]
        if type(sp) is dict and sp.get("start") == 0 and sp.get("end") == n_tokens:
            return [parse_version(sp.get("version"), fallback)] * n_tokens
    default = parse_version(meta.get("weight_version"), fallback)
    out = [default] * n_tokens
    if not spans:
        return out
    if not isinstance(spans, list):
        raise ProtocolError(f"weight_versions must be a list, got {type(spans).__name__}")
    for sp in spans:
        try:
            v = parse_version(sp["version"], fallback)
            start, end = int(sp["start"]), int(sp["end"])
        except (KeyError, TypeError, ValueError) as e:
            raise ProtocolError(f"bad weight_versions span {sp!r}") from e
        if not 0 <= start <= end:
            raise ProtocolError(f"bad weight_versions span {sp!r}")
        end = min(end, n_tokens)
        if start < end:
            out[start:end] = [v] * (end - start)
    return out


def parse_finish_reason(fr: Any) -> tuple[str, str]:
    """``(type, message)`` from SGLang's ``finish_reason`` dict (or an old-style string)."""
    if type(fr) is dict:
        kind, msg = fr.get("type"), fr.get("message") or ""
        if type(msg) is not str:
            msg = str(msg)
    elif isinstance(fr, str):
        kind, msg = fr, ""
    else:
        raise ProtocolError(f"finish_reason missing or malformed: {fr!r}")
    if kind not in FINISH_TYPES:
        raise ProtocolError(f"unknown finish_reason type {kind!r}")
    return kind, msg


def parse_generate_response(body: Any, fallback_version: int) -> Segment:
    """One non-streamed ``/generate`` answer -> ``Segment``; logprob null -> -inf.

    The per-request hot path of the client: exact-type checks first, the rare shapes after.
    """
    if type(body) is not dict:
        if isinstance(body, list):  # batch / n>1 shape; we always send one prompt with n=1
            if len(body) != 1:
                raise ProtocolError(f"expected one result, got a list of {len(body)}")
            body = body[0]
        if not isinstance(body, dict):
            raise ProtocolError(f"not a /generate response: {str(body)[:300]}")
    meta = body.get("meta_info")
    if not isinstance(meta, dict):
        raise ProtocolError(f"not a /generate response: {str(body)[:300]}")
    ids = body.get("output_ids")
    if type(ids) is not list:
        raise ProtocolError("response has no output_ids list")
    entries = meta.get("output_token_logprobs")
    if entries is None:
        raise ProtocolError("response has no output_token_logprobs (return_logprob was sent)")
    n = len(ids)
    if len(entries) != n:
        raise ProtocolError(f"{len(entries)} logprob entries for {n} output tokens")
    # One list comprehension (faster than map(itemgetter) on CPython 3.11+), and the token ids
    # checked at both ends (a misaligned or truncated list shows there).
    try:
        logprobs = [e[0] for e in entries]
        if n and (
            entries[0][1] not in (None, ids[0]) or entries[-1][1] not in (None, ids[-1])
        ):
            bad = 0 if entries[0][1] not in (None, ids[0]) else n - 1
            raise ProtocolError(
                f"logprob entry {bad} is for token {entries[bad][1]}, output has {ids[bad]}"
            )
    except (TypeError, IndexError, KeyError) as e:
        raise ProtocolError("output_token_logprobs entries must be [logprob, token_id, text]") from e
    try:
        sum(logprobs)  # a C loop that raises on a null: ~3x faster than `None in` on floats
    except TypeError:  # orjson writes -inf as null
        try:
            logprobs = [_NEG_INF if x is None else float(x) for x in logprobs]
        except (TypeError, ValueError) as e:
            raise ProtocolError(f"a logprob is neither a number nor null: {e}") from e
    kind, msg = parse_finish_reason(meta.get("finish_reason"))
    seg = Segment(
        ids, logprobs, token_versions(meta, n, fallback_version), kind, msg,
        meta.get("weight_version"),
    )
    routed = meta.get("routed_experts")
    if routed is not None:
        seg.routed_experts, seg.routed_start = decode_routed_experts(
            routed, meta.get("routed_experts_start_len"))
    return seg


def decode_routed_experts(value: Any, start: Any) -> tuple[np.ndarray, int]:
    """SGLang's ``meta_info.routed_experts`` (base64 of little-endian int32 bytes) as a flat
    array, and the row it starts at (``routed_experts_start_len``, 0 when absent)."""
    if not isinstance(value, str):
        raise ProtocolError(f"routed_experts must be a base64 string, got {type(value).__name__}")
    try:
        raw = base64.b64decode(value, validate=True)
    except ValueError as e:
        raise ProtocolError(f"routed_experts is not base64: {e}") from e
    if len(raw) % 4:
        raise ProtocolError(f"routed_experts holds {len(raw)} bytes, not int32 values")
    if start is not None and (type(start) is not int or start < 0):
        raise ProtocolError(f"routed_experts_start_len must be a non-negative int, got {start!r}")
    return np.frombuffer(raw, dtype="<i4"), int(start or 0)


class SGLangProtocol:
    """SGLang's ``/generate`` (a ``GenerateProtocol``); the functions above, unwrapped, and
    SGLang's control calls (protocol sections 4-6)."""

    name = "sglang"
    generate_path = "/generate"
    encode_generate_body = staticmethod(encode_generate_body)
    parse_generate_response = staticmethod(parse_generate_response)
    add_image_data = staticmethod(add_image_data)
    add_routed_experts_start = staticmethod(add_routed_experts_start)
    # optional members (``group_generate``): a GRPO group's first segments in one call
    encode_batch_body = staticmethod(encode_batch_body)
    parse_batch_response = staticmethod(parse_batch_response)
    version_info = "model_info"  # GET /model_info -> {"weight_version": "3", ...}
    continue_path = "/continue_generation"
    update_session_paths = ("/begin_weight_update", "/end_weight_update")  # 404 tolerated
    required_endpoints: tuple[tuple[str, str], ...] = ()
    weight_checksums = True  # /weights_checker hashes comparable with the trainer's
    supports_broadcast = True
    native_transfer = None  # broadcasts go over SGLang's own group calls
    lora_paths = ("/load_lora_adapter", "/unload_lora_adapter")  # LoRA pushes (load, unload)

    @staticmethod
    def pause_call(mode: str) -> tuple[str, dict[str, Any] | None]:
        return "/pause_generation", {"mode": mode}

    @staticmethod
    def disk_update_calls(path: str, version: int, flush: bool,
                          abort_all: bool = False) -> list[tuple[str, dict[str, Any]]]:
        return [("/update_weights_from_disk", {
            "model_path": path, "weight_version": str(version), "flush_cache": flush,
            "abort_all_requests": abort_all})]


SGLANG = SGLangProtocol()
