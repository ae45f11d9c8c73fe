"""The ``/generate`` contract gate: SGLang's schema check on the raw JSON body.

SGLang 0.5.23 refuses a ``/generate`` body that its wire schema rejects with
``400 {"error": "<serde-style text>"}`` (error shape 2 in docs/protocol.md): unknown keys inside
``sampling_params`` and wrongly typed values. Unknown *top-level* keys are ignored. This module
re-implements that judgement for the fields a client can send, with the same message texts, and
without importing SGLang (``servers/`` shares only the wire protocol).
"""

from __future__ import annotations

from typing import Any


class ContractError(ValueError):
    """A body that violates the wire schema (HTTP 400, shape 2)."""


# SGLang's sampling_params keys, in its declared order (the order appears in the error text).
SAMPLING_KEYS: tuple[str, ...] = (
    "max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p", "top_k",
    "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens", "n",
    "json_schema", "regex", "ebnf", "structural_tag", "ignore_eos", "skip_special_tokens",
    "spaces_between_special_tokens", "no_stop_trim", "stream_interval", "logit_bias",
    "sampling_seed", "custom_params", "beam_width", "watermark", "choice",
)


def _unexpected(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"boolean `{'true' if v else 'false'}`"
    if isinstance(v, int):
        return f"integer `{v}`"
    if isinstance(v, float):
        return f"floating point `{v}`"
    if isinstance(v, str):
        return f'string "{v}"'
    if isinstance(v, list):
        return "sequence"
    if isinstance(v, dict):
        return "map"
    return type(v).__name__


def _bad(v: Any, expected: str) -> ContractError:
    return ContractError(f"invalid type: {_unexpected(v)}, expected {expected}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _int(v: Any, expected: str = "i64") -> None:
    if not _is_int(v):
        raise _bad(v, expected)


def _uint(v: Any, expected: str = "u64") -> None:
    _int(v, expected)
    if v < 0:
        raise ContractError(f"invalid value: integer `{v}`, expected {expected}")


def _float(v: Any) -> None:
    if not _is_number(v):
        raise _bad(v, "f64")


def _bool(v: Any, expected: str = "a boolean") -> None:
    if not isinstance(v, bool):
        raise _bad(v, expected)


def _str(v: Any, expected: str = "a string") -> None:
    if not isinstance(v, str):
        raise _bad(v, expected)


def _seq(v: Any) -> list:
    if not isinstance(v, list):
        raise _bad(v, "a sequence")
    return v


def _str_or_list(v: Any, name: str = "StringOrList") -> None:
    if isinstance(v, list):
        for e in v:
            _str(e)
    else:
        _str(v, f"a value or an array of values for {name}")


def _int_list(v: Any) -> None:
    for e in _seq(v):
        _int(e)


def _check_sampling(value: Any) -> None:
    if not isinstance(value, dict):
        raise _bad(value, "struct SamplingParams")
    floats = {"temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty",
              "repetition_penalty"}
    ints = {"max_new_tokens", "top_k", "min_new_tokens", "n", "stream_interval",
            "sampling_seed", "beam_width"}
    bools = {"ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim"}
    strs = {"json_schema", "regex", "ebnf", "structural_tag"}
    for key, x in value.items():
        if key not in SAMPLING_KEYS:
            listed = ", ".join(f"`{f}`" for f in SAMPLING_KEYS)
            raise ContractError(f"unknown field `{key}`, expected one of {listed}")
        if x is None or key == "custom_params":
            continue
        if key in floats:
            _float(x)
        elif key in ints:
            _int(x)
        elif key in bools:
            _bool(x)
        elif key in strs:
            _str(x)
        elif key in ("stop", "stop_regex"):
            _str_or_list(x)
        elif key == "stop_token_ids":
            _int_list(x)
        elif key == "logit_bias":
            if not isinstance(x, dict):
                raise _bad(x, "a map")
            for e in x.values():
                _float(e)
        elif key == "choice":
            for e in _seq(x):
                _str(e)
        elif key == "watermark" and not isinstance(x, dict):
            raise _bad(x, "struct WatermarkRequestConfig")


def _check_token_ids_or_list(v: Any) -> None:
    if not isinstance(v, list):
        raise _bad(v, "a value or an array of values for TokenIdsOrList")
    if not v or _is_number(v[0]):
        _int_list(v)
    else:
        for row in v:
            _int_list(row)


def _check_bool_or_list(v: Any) -> None:
    if isinstance(v, list):
        for e in v:
            _bool(e)
    else:
        _bool(v, "a value or an array of values for BoolOrList")


def _check_int_or_list(v: Any) -> None:
    if isinstance(v, list):
        for e in v:
            _int(e)
    else:
        _int(v, "a value or an array of values for Int64OrList")


def check_generate_body(body: Any) -> None:
    """Raise ``ContractError`` with SGLang's text when ``body`` violates the schema."""
    if not isinstance(body, dict):
        raise _bad(body, "struct GenerateRequest")
    for key, x in body.items():
        if x is None:
            if key in ("return_prompt_token_ids", "routed_experts_start_len"):
                raise _bad(x, "a boolean" if key == "return_prompt_token_ids" else "i64")
            continue
        if key in ("rid", "text", "extra_key", "cache_salt"):
            _str_or_list(x)
        elif key in ("input_ids", "token_ids_logprob"):
            _check_token_ids_or_list(x)
        elif key in ("stream", "return_text_in_logprobs", "require_reasoning",
                     "return_prompt_token_ids", "return_routed_experts"):
            _bool(x)
        elif key == "sampling_params":
            if isinstance(x, list):
                for e in x:
                    _check_sampling(e)
            else:
                if not isinstance(x, dict):
                    raise _bad(x, "a value or an array of values for SamplingParamsOrList")
                _check_sampling(x)
        elif key in ("return_logprob", "return_hidden_states", "return_sampling_mask"):
            _check_bool_or_list(x)
        elif key in ("logprob_start_len", "top_logprobs_num"):
            _check_int_or_list(x)
        elif key in ("routed_dp_rank", "disagg_prefill_dp_rank", "priority",
                     "routed_experts_start_len"):
            _int(x)
        elif key == "max_thinking_tokens":
            _uint(x)
        elif key in ("routing_key", "session_id"):
            _str(x)
        elif key == "custom_labels":
            if not isinstance(x, dict):
                raise _bad(x, "a map")
            for e in x.values():
                _str(e)
