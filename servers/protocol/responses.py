"""Build ``/generate`` response objects (SGLang's shape) from an engine sequence snapshot.

``output_ids`` keep every generated token, the stop token included; only ``text`` is trimmed
(a matched stop token is left out of the text, a stop string cuts the text before it, unless
``no_stop_trim``). Logprob entries are ``[logprob, token_id, text|null]``.
"""

from __future__ import annotations

import math
import time
from typing import Any

from servers.engine.routed_experts import encode_routed_experts
from servers.engine.sequence import Sequence


class Detokenizer:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer

    def text(self, ids: list[int], skip_special: bool, spaces_between_special: bool = True) -> str:
        if self.tokenizer is None or not ids:
            return ""
        return self.tokenizer.decode(
            ids, skip_special_tokens=skip_special,
            spaces_between_special_tokens=spaces_between_special,
        )

    def token_texts(self, ids: list[int]) -> list[str]:
        if self.tokenizer is None:
            return [None] * len(ids)  # type: ignore[list-item]
        return [self.tokenizer.decode([i]) for i in ids]


def _num(v: float | None) -> float | None:
    """JSON has no NaN or infinity: like SGLang's orjson, send them as null."""
    return v if v is not None and math.isfinite(v) else None


def _entries(vals: list, ids: list[int], texts: list[str] | None) -> list[list]:
    if texts is None:
        return [[_num(v), t, None] for v, t in zip(vals, ids)]
    return [[_num(v), t, x] for v, t, x in zip(vals, ids, texts)]


def _tops(rows: list, detok: Detokenizer, with_text: bool) -> list:
    out = []
    for row in rows:
        if row is None:
            out.append(None)
            continue
        ids = [i for _, i in row]
        texts = detok.token_texts(ids) if with_text else [None] * len(ids)
        out.append([[_num(v), i, x] for (v, i), x in zip(row, texts)])
    return out


def build_output(
    seq: Sequence,
    n_out: int,
    final: bool,
    detok: Detokenizer,
    weight_version: str,
    return_text_in_logprobs: bool = False,
    return_prompt_token_ids: bool = False,
    skip_tokenizer_init: bool = False,
) -> dict[str, Any]:
    ids = seq.output_ids[:n_out]
    p = seq.params
    finish = seq.finish if final else None
    text_ids = ids
    if finish and finish.get("type") == "stop" and isinstance(finish.get("matched"), int):
        if not p.no_stop_trim and text_ids and text_ids[-1] == finish["matched"]:
            text_ids = text_ids[:-1]
    meta: dict[str, Any] = {"id": seq.rid, "finish_reason": finish}
    waiting_abort = bool(finish and finish.get("type") == "abort" and not seq.ever_ran)
    if not waiting_abort:  # SGLang: an abort in the waiting queue carries no prompt_tokens
        meta["prompt_tokens"] = len(seq.prompt)
    meta.update({
        "weight_version": weight_version,
        "completion_tokens": n_out,
        "cached_tokens": 0,
        "reasoning_tokens": 0,
        "num_retractions": seq.num_retractions,
    })
    if seq.return_logprob:
        texts = detok.token_texts(ids) if return_text_in_logprobs else None
        meta["output_token_logprobs"] = _entries(seq.output_logprobs[:n_out], ids, texts)
        meta["output_token_logprobs_length"] = n_out
        in_vals = seq.input_logprobs or []
        start = len(seq.prompt) - len(in_vals)
        in_ids = seq.prompt[start:]
        in_texts = detok.token_texts(in_ids) if return_text_in_logprobs else None
        meta["input_token_logprobs"] = _entries(in_vals, in_ids, in_texts)
        if seq.top_logprobs_num > 0:
            meta["output_top_logprobs"] = _tops(seq.output_top[:n_out], detok, return_text_in_logprobs)
            meta["input_top_logprobs"] = _tops(seq.input_top or [], detok, return_text_in_logprobs)
    if final:
        spans = seq.spans or [{"version": weight_version, "start": 0, "end": n_out}]
        meta["weight_versions"] = spans
        meta["weight_version"] = spans[-1]["version"]
        end = seq.finished_time or time.time()
        meta["e2e_latency"] = end - seq.created
        # SGLang collects them once the request finished; one aborted before its first forward
        # has none to report (the client's next segment asks for them again)
        if seq.routing is not None and seq.ever_ran:
            rows = seq.routing.rows(len(seq.prompt) + n_out - 1)
            meta["routed_experts"] = encode_routed_experts(rows)
            meta["routed_experts_start_len"] = seq.routing.start_len
    meta["response_sent_to_client_ts"] = time.time()
    out: dict[str, Any] = {}
    if not skip_tokenizer_init:
        text = detok.text(text_ids, p.skip_special_tokens, p.spaces_between_special_tokens)
        if finish and finish.get("type") == "stop" and isinstance(finish.get("matched"), str):
            if not p.no_stop_trim:
                cut = text.find(finish["matched"])
                if cut >= 0:
                    text = text[:cut]
        out["text"] = text
    out["output_ids"] = ids
    out["meta_info"] = meta
    if return_prompt_token_ids:
        out["prompt_token_ids"] = list(seq.prompt)
    return out
