"""A deep model's peak from two shallow traces: the update of ``n`` and ``n + 1`` identical
decoder layers, its live-bytes timeline cut by the decoder layer running, scaled to the real
layer count.

Why it is exact for identical layers: every layer runs the same ops on the same shapes, so the
live bytes while layer ``i`` of an ``N``-layer model runs are that layer's own profile
(the same for every ``i``) on top of an offset ``a + b*N + c*i`` (the layers' parameters,
gradients and optimizer state grow with ``N``; the checkpointed inputs saved below layer ``i``,
the gradients accumulated above it, with ``i``). Outside the layers (embedding, head, loss,
clipping, the optimizer step) the offset is ``a + b*N``. So the timeline is recorded as
segments -- a maximal run of ops inside one decoder layer, or outside all of them -- each with
its largest live total and the breakdown at that moment; the first and the last layer keep
their own segments (FSDP2 prefetches the next layer's parameters, except after the last), and
each middle layer's largest value is ``a + b*N + c*i``, maximal at ``i = 1`` or ``i = N - 2``.
The two traces give ``b`` (and the middle layers' ``c``); the plan is the largest segment at
``N``. ``tests/memplan/test_layer_scaling.py`` checks it against the full trace to the byte.

Why: the planner's cost grows with the ops it runs (and torch's tracker scans every module at
every op), so a 36-layer 8B shape cost a minute of CPU time; two shallow traces cost about
seven layers' worth whatever the depth.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

# the shallow depths traced: the first, one or two middle layers, the last
SHALLOW = (3, 4)
# config fields that make layers differ from one another (a plan with any of them set traces
# the full model): per-layer attention kinds, dense layers among MoE ones
_LAYER_LISTS = ("layer_types", "mlp_only_layers")


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The model's stack of decoder layers: its longest ``ModuleList`` of one module class."""
    best = None
    for m in model.modules():
        if isinstance(m, torch.nn.ModuleList) and len(m) and \
                len({type(c) for c in m}) == 1 and (best is None or len(m) > len(best)):
            best = m
    if best is None:
        raise ValueError("no stack of decoder layers found")
    return best


def scalable(hf: dict[str, Any]) -> bool:
    """Whether the config's decoder layers are identical (so two shallow traces give the plan
    exactly) and deeper than the traces."""
    cfg = hf.get("text_config") or hf
    n = int(cfg.get("num_hidden_layers", 0))
    if n <= SHALLOW[-1]:
        return False
    types = cfg.get("layer_types")
    if types and len(set(types)) > 1:
        return False
    if cfg.get("mlp_only_layers") or int(cfg.get("decoder_sparse_step", 1) or 1) != 1:
        return False
    # DeepSeek-style dense first layers, interleaved sliding windows
    if int(cfg.get("first_k_dense_replace", 0) or 0) or cfg.get("use_sliding_window"):
        return False
    return True


def with_layers(hf: dict[str, Any], n: int) -> dict[str, Any]:
    """``hf`` with ``n`` decoder layers (the per-layer lists cut to ``n``)."""
    out = dict(hf)
    inner = dict(out.get("text_config") or out)
    inner["num_hidden_layers"] = n
    for k in _LAYER_LISTS:
        if isinstance(inner.get(k), list):
            inner[k] = inner[k][:n]
    if "text_config" in out:
        out["text_config"] = inner
        return out
    return inner


@dataclass
class Segment:
    layer: int  # decoder layer index, -1 outside every layer
    peak: int = -1
    snapshot: dict[str, int] = field(default_factory=dict)


class SegmentRecorder:
    """Replaces a ``MemTracker``'s per-op peak update (called after every op) with one that
    keeps the global peak as before and, per segment, its largest live total with the
    breakdown at that moment. (The tracker's per-module peaks, which nothing here reads, are
    not kept: updating them scans every module at every op.)"""

    def __init__(self, tracker: Any, model: torch.nn.Module, extra: Any = None) -> None:
        root = type(model).__name__  # the tracker's ModTracker names modules from the root
        names = {m: f"{root}.{n}" for n, m in model.named_modules() if n}
        self.layer_of = {names[m]: i for i, m in enumerate(decoder_layers(model))}
        self.tracker = tracker
        self.extra = extra  # a LiveBytes: its vocab_live is sampled beside the breakdown
        self.segments: list[Segment] = []
        tracker._update_peak_stats = self.update

    def _layer(self) -> int:
        for name in self.tracker._mod_tracker.parents:
            i = self.layer_of.get(name)
            if i is not None:
                return i
        return -1

    def update(self, _state: Any = None) -> None:
        t = self.tracker
        for dev, snap in t._curr_mem_snap.items():
            total = snap["Total"] if "Total" in snap else snap[_total_key(snap)]
            if t._peak_mem.get(dev, 0) < total:
                t._peak_mem[dev] = total
                t._peak_mem_snap[dev] = dict(snap)
            layer = self._layer()
            if not self.segments or self.segments[-1].layer != layer:
                self.segments.append(Segment(layer))
            seg = self.segments[-1]
            if total > seg.peak:
                seg.peak = total
                seg.snapshot = {str(getattr(k, "value", k)): int(v) for k, v in snap.items()}
                if self.extra is not None:
                    seg.snapshot["vocab"] = int(self.extra.vocab_live)


def _total_key(snap: dict) -> Any:
    return next(k for k in snap if str(getattr(k, "value", k)) == "Total")


def _chunks(segments: list[Segment], n: int) -> list[tuple[str, list[Segment]]]:
    """An ``n``-layer trace's segments as runs of chunks: a chunk is one decoder layer's
    segment and the outside segment that follows it when the next layer's comes right after
    (FSDP2's post-forward work runs outside the layer's module); kind "first", "last" or
    "mid" by the layer, "out" for the other outside segments. Consecutive "mid" chunks are one
    run."""
    chunks: list[tuple[str, list[Segment]]] = []
    i = 0
    while i < len(segments):
        s = segments[i]
        if s.layer < 0:
            chunks.append(("out", [s]))
            i += 1
            continue
        part = [s]
        if i + 2 < len(segments) and segments[i + 1].layer < 0 and segments[i + 2].layer >= 0:
            part.append(segments[i + 1])
        i += len(part)
        kind = "first" if s.layer == 0 else "last" if s.layer == n - 1 else "mid"
        chunks.append((kind, part))
    return chunks


def _signature(chunks: list[tuple[str, list[Segment]]]
               ) -> tuple[list[tuple[str, int]], list[list[list[Segment]]]]:
    """(kind, segments per chunk) with each run of middle layers one item, and the runs."""
    sig: list[tuple[str, int]] = []
    runs: list[list[list[Segment]]] = []
    for kind, part in chunks:
        if kind == "mid" and sig and sig[-1][0] == "mid":
            if len(part) != sig[-1][1]:
                raise ValueError("middle layers with different segment counts")
            runs[-1].append(part)
            continue
        sig.append((kind, len(part)))
        if kind == "mid":
            runs.append([part])
    return sig, runs


def _line(v1: int, v2: int, n1: int, n2: int, n: int) -> int:
    """The affine function through (n1, v1) and (n2, v2), at n (integer bytes: exact when the
    per-layer step is)."""
    step, rem = divmod(v2 - v1, n2 - n1)
    if rem:
        raise ValueError("a per-layer step that is not a whole number of bytes")
    return v1 + step * (n - n1)


def _scaled(s1: dict[str, int], s2: dict[str, int], n1: int, n2: int, n: int
            ) -> dict[str, int]:
    return {k: _line(s1.get(k, 0), s2.get(k, 0), n1, n2, n) for k in set(s1) | set(s2)}


def scale_segments(seg1: list[Segment], seg2: list[Segment], n1: int, n2: int, n: int
                   ) -> dict[str, int]:
    """The breakdown (with "Total") at the peak of an ``n``-layer update, from the segments
    of its ``n1``- and ``n2 = n1 + 1``-layer traces (``n1 >= 3``: one middle layer or more)."""
    if n2 != n1 + 1 or n1 < 3:
        raise ValueError("scaling needs traces of n and n + 1 layers, n >= 3")
    c1, c2 = _chunks(seg1, n1), _chunks(seg2, n2)
    sig1, runs1 = _signature(c1)
    sig2, runs2 = _signature(c2)
    if sig1 != sig2:
        raise ValueError("the shallow traces' segments do not line up")
    fixed1 = [part for kind, part in c1 if kind != "mid"]
    fixed2 = [part for kind, part in c2 if kind != "mid"]
    candidates: list[dict[str, int]] = []
    for p1, p2 in zip(fixed1, fixed2):  # outside and first/last layer: a + b*N
        candidates += [_scaled(a.snapshot, b.snapshot, n1, n2, n) for a, b in zip(p1, p2)]
    for r1, r2 in zip(runs1, runs2):
        # the r-th middle layer to run (r = 0 .. N-3), each of its segments: a + b*N + c*r;
        # the n1 trace has r = 0, the n2 trace r = 0 and 1
        for k in range(len(r1[0])):
            first1, first2 = r1[0][k].snapshot, r2[0][k].snapshot
            second2 = r2[1][k].snapshot
            at0 = _scaled(first1, first2, n1, n2, n)
            keys = set(at0) | set(second2)
            last = {key: at0.get(key, 0) + (second2.get(key, 0) - first2.get(key, 0)) * (n - 3)
                    for key in keys}
            candidates += [at0, last]
    best = candidates[0]
    for c in candidates[1:]:
        if c["Total"] > best["Total"]:
            best = c
    return best
