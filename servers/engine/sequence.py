"""The engine's per-sequence state, and SGLang's weight-version spans.

A ``Sequence`` is written only by the engine thread. The HTTP side reads it from the event
loop: every list only grows, and each delivered event carries the output length at that moment
(``n_out``), so the reader slices a consistent prefix without locks.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from servers.protocol.request import SamplingParams

# A serial that is never reused in a process: ``id()`` of a freed Sequence can come back for
# the next one, so any cache keyed by sequence identity must key on this instead.
_serials = itertools.count()


def weight_version_spans(
    events: list[tuple[str, int]], current_version: str, num_output_tokens: int
) -> list[dict[str, Any]]:
    """Spans over output-token indices, one per weight version that produced tokens.

    ``events`` holds ``(old_version, n_out_at_change)`` recorded whenever the server's version
    changed while the sequence had output; the last span runs to the end with the version at
    finish. Empty spans are dropped and neighbours with one version merge (SGLang's rule).
    """
    spans: list[dict[str, Any]] = []
    for version, end in [*events, (current_version, num_output_tokens)]:
        end = min(end, num_output_tokens)
        if spans and end <= spans[-1]["end"]:
            continue
        if spans and version == spans[-1]["version"]:
            spans[-1]["end"] = end
            continue
        start = spans[-1]["end"] if spans else 0
        spans.append({"version": version, "start": start, "end": end})
    if not spans:  # no output at all: one empty span with the current version
        spans.append({"version": current_version, "start": 0, "end": 0})
    return spans


@dataclass(eq=False)
class Sequence:
    rid: str
    prompt: list[int]
    params: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    stream: bool = False
    internal: bool = False  # health probes: not counted in metrics
    max_new_tokens: int | None = None  # after clipping to the context length
    created: float = field(default_factory=time.time)
    first_token_time: float | None = None
    finished_time: float | None = None

    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_top: list[list[tuple[float, int]]] = field(default_factory=list)
    input_logprobs: list[float | None] | None = None
    input_top: list[list[tuple[float, int]] | None] | None = None
    version_events: list[tuple[str, int]] = field(default_factory=list)
    spans: list[dict[str, Any]] | None = None
    finish: dict[str, Any] | None = None
    num_retractions: int = 0
    ever_ran: bool = False  # had a row at least once (for "Abort in waiting queue")
    vision: Any = None  # servers.engine.vision.VisionPrompt of a prompt with images
    lora: Any = None  # the LoRAAdapter it runs on (held, so an unload lets it finish)
    # servers.engine.routed_experts.SequenceRouting when the request set return_routed_experts
    routing: Any = None
    grammar: Any = None  # servers.engine.grammar.Constraint of a structured-output request

    # engine bookkeeping
    kv_len: int = 0  # tokens of prompt + output held in this sequence's KV row
    row: int = -1
    on_event: Callable[[Sequence, int, bool], None] | None = None
    serial: int = field(default_factory=_serials.__next__, init=False)

    @property
    def finished(self) -> bool:
        return self.finish is not None

    def feed_tokens(self) -> list[int]:
        """Tokens not yet in the KV cache (a fresh or retracted sequence: everything)."""
        full = self.prompt + self.output_ids
        return full[self.kv_len:]

    def total_len(self) -> int:
        return len(self.prompt) + len(self.output_ids)
