"""Turn a ``/generate`` body into per-sequence requests, with SGLang's defaults and checks.

Mirrors SGLang's ``GenerateReqInput.normalize_batch_and_arguments`` and
``SamplingParams.verify``: single vs batch, ``n > 1`` expansion (prompt-major, fresh uuid rids),
``"<rid>_<i>"`` batch rids, per-item logprob settings, and the same ValueError texts (they
reach the client as ``400 {"error": {"message": ...}}``).
"""

from __future__ import annotations

import functools
import json
import math
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import re2

TOP_K_ALL = 1 << 30
MAX_STOP = 32
MAX_SEQUENCES = 4096  # batch x n per call: bounds the work one request can queue
_UNSUPPORTED = ("structural_tag",)
GRAMMAR_KINDS = ("json_schema", "regex", "ebnf")
ANY_JSON = "$$ANY$$"  # SGLang's json_schema key for its built-in any-JSON grammar


@dataclass(frozen=True)
class GrammarSpec:
    """What a request constrains its output to (``servers.engine.grammar`` enforces it):
    ``kind`` one of ``GRAMMAR_KINDS`` or ``"tool_call"`` (``value``: the tools as JSON)."""

    kind: str
    value: str


@dataclass
class SamplingParams:
    """SGLang's sampling parameters after defaults (greedy folded into top_k = 1)."""

    max_new_tokens: int | None = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = TOP_K_ALL
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)
    stop_regex: list[str] = field(default_factory=list)
    stop_token_ids: set[int] = field(default_factory=set)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    logit_bias: dict[int, float] = field(default_factory=dict)
    sampling_seed: int | None = None
    stream_interval: int | None = None
    # max_new_tokens as the request gave it (None when absent or null): SGLang checks only a
    # given value against the context window, the default 128 is clipped silently
    requested_max_new_tokens: int | None = None
    grammar: GrammarSpec | None = None  # json_schema / regex / ebnf (one at most, as SGLang)

    @property
    def greedy(self) -> bool:
        return self.top_k == 1

    @property
    def has_penalty(self) -> bool:
        return (
            self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
            or self.repetition_penalty != 1.0
        )

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None, vocab_size: int) -> SamplingParams:
        d = dict(d or {})
        for key in _UNSUPPORTED:
            if d.get(key):
                raise ValueError(f"{key} is not supported by the embedded server.")
        if d.get("beam_width") not in (None, 1):
            raise ValueError("beam_width > 1 is not supported by the embedded server.")
        p = cls()
        for name in ("min_new_tokens", "temperature", "top_p", "min_p", "frequency_penalty",
                     "presence_penalty", "repetition_penalty", "n", "ignore_eos",
                     "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim",
                     "sampling_seed", "stream_interval"):
            if d.get(name) is not None:
                setattr(p, name, d[name])
        p.temperature = float(p.temperature)
        if "max_new_tokens" in d:
            p.max_new_tokens = d["max_new_tokens"]  # null means unlimited
            p.requested_max_new_tokens = d["max_new_tokens"]
        top_k = d.get("top_k")
        p.top_k = TOP_K_ALL if top_k is None or top_k == -1 else top_k
        if top_k is not None and top_k != -1 and top_k < 1:
            raise ValueError(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
        stop = d.get("stop")
        p.stop = [stop] if isinstance(stop, str) else list(stop or [])
        regex = d.get("stop_regex")
        p.stop_regex = [regex] if isinstance(regex, str) else list(regex or [])
        p.stop_token_ids = {int(t) for t in (d.get("stop_token_ids") or []) if t is not None}
        p.logit_bias = {int(k): float(v) for k, v in (d.get("logit_bias") or {}).items()
                        if _int_like(k, vocab_size)}
        if 0 <= p.temperature < 1e-6:  # SGLang: greedy = temperature 1 and top_k 1
            p.temperature, p.top_k = 1.0, 1
        kinds = [k for k in GRAMMAR_KINDS if d.get(k)]
        if len(kinds) > 1:
            raise ValueError("Only one of json_schema, regex, ebnf, or structural_tag can be set.")
        if kinds:
            value = d[kinds[0]]
            if kinds[0] == "json_schema" and isinstance(value, dict):
                value = json.dumps(value)
            if not isinstance(value, str):
                raise ValueError(f"{kinds[0]} must be a string, got {type(value).__name__}.")
            p.grammar = GrammarSpec(kinds[0], value)
        p.verify(vocab_size, d.get("logit_bias") or {})
        return p

    def verify(self, vocab_size: int, raw_bias: dict) -> None:
        if not math.isfinite(self.temperature) or self.temperature < 0.0:
            raise ValueError(
                f"temperature must be a non-negative finite number, got {self.temperature}."
            )
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}.")
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}.")
        if not 0.0 < self.repetition_penalty <= 2.0:
            raise ValueError(
                "repetition_penalty must be in (0, 2] (1.0 = no penalty), "
                f"got {self.repetition_penalty}."
            )
        if self.min_new_tokens < 0:
            raise ValueError(
                f"min_new_tokens must be in [0, max_new_tokens], got {self.min_new_tokens}."
            )
        if self.max_new_tokens is not None:
            if self.max_new_tokens < 0:
                raise ValueError(f"max_new_tokens must be at least 0, got {self.max_new_tokens}.")
            if self.min_new_tokens > self.max_new_tokens:
                raise ValueError(
                    f"min_new_tokens must be in [0, max_new_tokens({self.max_new_tokens})], "
                    f"got {self.min_new_tokens}."
                )
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}.")
        for key in raw_bias:
            if not _int_like(key, vocab_size):
                raise ValueError(f"logit_bias must has keys in [0, {vocab_size - 1}], got {key}.")
        if self.sampling_seed is not None and not -(2**63) <= self.sampling_seed <= 2**63 - 1:
            raise ValueError(
                f"sampling_seed must be in [-2**63, 2**63 - 1], got {self.sampling_seed}."
            )
        if len(self.stop) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings are allowed, got {len(self.stop)}")
        if len(self.stop_regex) > MAX_STOP:
            raise ValueError(
                f"at most {MAX_STOP} stop_regex patterns are allowed, got {len(self.stop_regex)}"
            )
        for pattern in self.stop_regex:
            if len(pattern.encode("utf-8")) > 256:
                raise ValueError("stop_regex is over the 256-byte limit")
            compile_stop_regex(pattern)  # a 400 here, never a fault in the engine
        # Checked against the loaded model here, so nothing that reaches the engine can fault
        # a step (an out-of-range id used to fail every request in the batch).
        for t in self.stop_token_ids:
            if not 0 <= t < vocab_size:
                raise ValueError(
                    f"stop_token_ids must hold token ids in [0, {vocab_size - 1}], got {t}."
                )
        for tok, bias in self.logit_bias.items():
            if not math.isfinite(bias):
                raise ValueError(
                    f"logit_bias values must be finite numbers, got {bias} for token {tok} "
                    "(use -100 to ban a token)."
                )


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False


@functools.lru_cache(maxsize=1024)
def compile_stop_regex(pattern: str) -> re2._Regexp:
    """A stop regex as RE2 runs it: linear time in the text, so no pattern can stall the
    engine (Python's backtracking ``re`` takes exponential time on ``^(a|aa)+b$``). Patterns RE2
    cannot run (backreferences, lookaround) are a 400."""
    try:
        return re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as e:
        msg = e.args[0].decode(errors="replace") if e.args and isinstance(e.args[0], bytes) else e
        raise ValueError(f"stop_regex {pattern!r} is not a valid RE2 pattern: {msg}") from None


def _int_like(key: Any, vocab_size: int) -> bool:
    try:
        return 0 <= int(key) < vocab_size
    except (TypeError, ValueError):
        return False


@dataclass
class SubRequest:
    """One sequence to generate (a batch item or one of n samples)."""

    rid: str
    index: int
    input_ids: list[int] | None
    text: str | None
    params: SamplingParams
    return_logprob: bool
    logprob_start_len: int
    top_logprobs_num: int


@dataclass
class NormalizedGenerate:
    items: list[SubRequest]
    is_single: bool  # the response is one object, not a list
    stream: bool
    return_text_in_logprobs: bool
    return_prompt_token_ids: bool


def _per_item(value: Any, num: int, default: Any, name: str, n: int) -> list:
    if value is None:
        return [default] * num
    if isinstance(value, list):
        if n > 1:
            raise ValueError(f"List-valued {name} is not supported with n > 1.")
        if len(value) != num:
            raise ValueError(f"The length of {name} ({len(value)}) must equal the batch size ({num}).")
        return [default if v is None else v for v in value]
    return [value] * num


def normalize_generate(body: dict[str, Any], vocab_size: int) -> NormalizedGenerate:
    """Validate and expand a contract-checked ``/generate`` body (raises ValueError)."""
    text, input_ids = body.get("text"), body.get("input_ids")
    if body.get("input_embeds") is not None:
        raise ValueError("input_embeds is not supported by the embedded server.")
    if text is None and input_ids is None:
        raise ValueError("Either text, input_ids or input_embeds should be provided.")
    if text is not None:
        is_single = isinstance(text, str)
        prompts_text = [text] if is_single else list(text)
        batch = len(prompts_text)
        prompts_ids = None
        if input_ids is not None:  # SGLang: batch-ness from text, but input_ids are used
            if len(input_ids) == 0:
                raise ValueError("input_ids cannot be empty.")
            prompts_ids = [input_ids] if isinstance(input_ids[0], int) else list(input_ids)
            if len(prompts_ids) != batch:
                raise ValueError(
                    f"input_ids hold {len(prompts_ids)} prompts but text holds {batch}."
                )
    else:
        if len(input_ids) == 0:
            raise ValueError("input_ids cannot be empty.")
        is_single = isinstance(input_ids[0], int)
        prompts_ids = [input_ids] if is_single else list(input_ids)
        prompts_text = None
        batch = len(prompts_ids)
    if prompts_ids is not None:
        for ids in prompts_ids:
            if len(ids) == 0:
                raise ValueError("input_ids cannot be empty.")
            if any(t < 0 or t >= vocab_size for t in ids):
                raise ValueError(f"Token ids must be in [0, {vocab_size - 1}].")
    if batch == 0:
        raise ValueError("The batch is empty.")

    raw_sp = body.get("sampling_params")
    if isinstance(raw_sp, list):
        if len(raw_sp) != batch:
            raise ValueError(
                f"The length of sampling_params ({len(raw_sp)}) must equal the batch size ({batch})."
            )
        n = (raw_sp[0] or {}).get("n") or 1
        if any(((sp or {}).get("n") or 1) != n for sp in raw_sp):
            raise ValueError(
                "The parallel_sample_num should be the same for all samples in sample params."
            )
        sps = [SamplingParams.from_dict(sp, vocab_size) for sp in raw_sp]
    else:
        one = SamplingParams.from_dict(raw_sp, vocab_size)
        n = one.n
        sps = [one] + [SamplingParams.from_dict(raw_sp, vocab_size) for _ in range(batch - 1)]
    if n > 1:
        is_single = False
    num = batch * n
    if num > MAX_SEQUENCES:
        raise ValueError(
            f"A request may expand to at most {MAX_SEQUENCES} sequences (batch x n), got {num}."
        )
    lp = _per_item(body.get("return_logprob"), batch, False, "return_logprob", n)
    lsl = _per_item(body.get("logprob_start_len"), batch, -1, "logprob_start_len", n)
    tln = _per_item(body.get("top_logprobs_num"), batch, 0, "top_logprobs_num", n)

    rid = body.get("rid")
    if n > 1:
        rids = [uuid.uuid4().hex for _ in range(num)]  # SGLang gives each sample a fresh rid
    elif rid is None:
        rids = [uuid.uuid4().hex for _ in range(num)]
    elif isinstance(rid, str):
        rids = [rid] if is_single else [f"{rid}_{i}" for i in range(num)]
    else:
        if len(rid) != num:
            raise ValueError("The specified rids length mismatch with the batch_size for batch processing.")
        rids = list(rid)
    dup = [r for r, c in Counter(rids).items() if c > 1]
    if dup:
        raise ValueError(f"Duplicate request IDs detected within the request: {dup}")

    items = []
    for i in range(num):
        p = i // n  # prompt-major: [p0s0, p0s1, ..., p1s0, ...]
        params = sps[p] if n == 1 else SamplingParams.from_dict(
            raw_sp[p] if isinstance(raw_sp, list) else raw_sp, vocab_size
        )
        for name, val in (("top_logprobs_num", tln[p]),):
            if val < 0:
                raise ValueError(f"{name} must be non-negative, got {val}.")
        items.append(SubRequest(
            rid=rids[i], index=i,
            input_ids=list(prompts_ids[p]) if prompts_ids is not None else None,
            text=prompts_text[p] if prompts_text is not None else None,
            params=params, return_logprob=bool(lp[p]), logprob_start_len=int(lsl[p]),
            top_logprobs_num=int(tln[p]),
        ))
    return NormalizedGenerate(
        items=items, is_single=is_single, stream=bool(body.get("stream") or False),
        return_text_in_logprobs=bool(body.get("return_text_in_logprobs") or False),
        return_prompt_token_ids=bool(body.get("return_prompt_token_ids") or False),
    )
