"""A PNG of a trace's timeline (``stats_logger.trace=true``), for a results page:
``python -m arealite.observe.trace_plot logs/trace_rank0.json timeline.png [--steps 10:13]``.

Rows from the top: the trainer's phases inside each step, the weight pushes, then one row per
episode lane (queue wait light, run dark, colour by outcome) and one per request lane
(generation segments coloured by server, pauses grey, reward calls black).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from arealite.observe.trace import LANE_BASES, TRAINER_TID, WEIGHT_PUSH_TID, load_trace

PHASE_COLORS = {"rollout_wait": "#d62728", "logp": "#9467bd", "update": "#1f77b4",
                "weight_sync": "#ff7f0e", "weight_upload": "#ffbb78", "eval": "#8c564b"}
OUTCOME_COLORS = {"accepted": "#2ca02c", "rejected": "#bcbd22", "failed": "#d62728"}
EPISODE_BAND, REQUEST_BAND = 6.0, 10.0  # rows of height the lanes of each kind share
SERVER_COLORS = ["#17becf", "#e377c2", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173"]


def select_steps(events: list[dict[str, Any]], steps: tuple[int, int] | None) -> tuple[float, float]:
    """The window (µs) of steps a..b inclusive; the last three steps when None."""
    spans = sorted((e for e in events if e.get("cat") == "step"), key=lambda e: e["args"]["step"])
    if not spans:
        raise ValueError("the trace has no step")
    if steps is None:
        chosen = spans[-3:]
    else:
        chosen = [e for e in spans if steps[0] <= e["args"]["step"] <= steps[1]]
        if not chosen:
            raise ValueError(f"no step in {steps[0]}..{steps[1]} (the trace has "
                             f"{spans[0]['args']['step']}..{spans[-1]['args']['step']})")
    return chosen[0]["ts"], chosen[-1]["ts"] + chosen[-1]["dur"]


def plot_trace(trace_path: str | os.PathLike, out_png: str | os.PathLike,
               steps: tuple[int, int] | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    events = [e for e in load_trace(trace_path) if e.get("ph") == "X"]
    lo, hi = select_steps(events, steps)
    shown = [e for e in events if e["ts"] < hi and e["ts"] + e["dur"] > lo]
    lanes = sorted({e["tid"] for e in shown if e["tid"] not in (TRAINER_TID, WEIGHT_PUSH_TID)})
    ep_lanes = [t for t in lanes if t < LANE_BASES["call"]]
    call_lanes = [t for t in lanes if t >= LANE_BASES["call"]]
    # fixed bands, so a run with hundreds of request lanes still fits one readable figure:
    # (centre, height) per lane, from the top
    y: dict[int, float] = {TRAINER_TID: 0.0, WEIGHT_PUSH_TID: -1.0}
    h: dict[int, float] = {TRAINER_TID: 1.0, WEIGHT_PUSH_TID: 1.0}
    top = -1.5
    for band, size in ((ep_lanes, EPISODE_BAND), (call_lanes, REQUEST_BAND)):
        step = min(1.0, size / max(1, len(band)))
        for i, tid in enumerate(band):
            y[tid], h[tid] = top - step * (i + 0.5), step
        top -= step * len(band) + 0.5
    servers = sorted({e["args"]["server"] for e in shown if e["cat"] == "generate"})
    color_of = {s: SERVER_COLORS[i % len(SERVER_COLORS)] for i, s in enumerate(servers)}
    fig, ax = plt.subplots(figsize=(14, 2 + 0.3 * (2 - top)))
    try:
        for e in shown:
            x0, w = (max(e["ts"], lo) - lo) / 1e6, (min(e["ts"] + e["dur"], hi) - max(e["ts"], lo)) / 1e6
            cat, row, k = e["cat"], y[e["tid"]], h[e["tid"]]
            if cat == "step":
                ax.broken_barh([(x0, w)], (row - 0.45, 0.9), facecolors="none", edgecolors="black")
                ax.text(x0, row + 0.5, e["name"], fontsize=7, va="bottom")
            elif cat == "timeperf":
                inner = e["name"] == "weight_upload"
                ax.broken_barh([(x0, w)], (row - (0.2 if inner else 0.4), 0.4 if inner else 0.8),
                               facecolors=PHASE_COLORS.get(e["name"], "#7f7f7f"))
            elif cat == "weight_push":
                ax.broken_barh([(x0, w)], (row - 0.4, 0.8), facecolors="#ff7f0e")
            elif cat == "episode":
                ax.broken_barh([(x0, w)], (row - 0.4 * k, 0.8 * k),
                               facecolors=OUTCOME_COLORS.get(e["args"]["outcome"], "#7f7f7f"))
            elif cat == "queue":
                ax.broken_barh([(x0, w)], (row - 0.4 * k, 0.8 * k), facecolors="#dddddd")
            elif cat == "generate":
                ax.broken_barh([(x0, w)], (row - 0.4 * k, 0.8 * k), facecolors=color_of[e["args"]["server"]])
            elif cat == "pause":
                ax.broken_barh([(x0, w)], (row - 0.2 * k, 0.4 * k), facecolors="#999999")
            elif cat == "reward":
                ax.broken_barh([(x0, w)], (row - 0.4 * k, 0.8 * k), facecolors="black")
        ticks = [(0.0, "trainer"), (-1.0, "weight push")]
        for band, label in ((ep_lanes, "episodes"), (call_lanes, "requests,\nreward calls")):
            if band:
                ticks.append(((y[band[0]] + y[band[-1]]) / 2, f"{label}\n({len(band)} lanes)"))
        ax.set_yticks([t for t, _ in ticks])
        ax.set_yticklabels([lab for _, lab in ticks], fontsize=8)
        ax.set_ylim(top, 1.2)
        ax.set_xlim(0, (hi - lo) / 1e6)
        ax.set_xlabel("seconds")
        handles = [Patch(color=c, label=p) for p, c in PHASE_COLORS.items()]
        handles += [Patch(color=c, label=f"episode {o}") for o, c in OUTCOME_COLORS.items()]
        handles += [Patch(color="#dddddd", label="queued (gate)"), Patch(color="#999999", label="paused"),
                    Patch(color="black", label="reward call")]
        handles += [Patch(color=color_of[s], label=f"generate @ {s}") for s in servers]
        ax.legend(handles=handles, fontsize=7, ncol=6, loc="upper center", bbox_to_anchor=(0.5, -0.12))
        ax.set_title(f"{Path(trace_path).name}: where each step's time went")
        out = Path(out_png)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=110, bbox_inches="tight")
    finally:
        plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m arealite.observe.trace_plot", description=__doc__.split("\n\n")[0])
    p.add_argument("trace")
    p.add_argument("png")
    p.add_argument("--steps", default=None, help="a:b, inclusive (default: the last three)")
    args = p.parse_args(argv)
    try:
        steps = tuple(int(x) for x in args.steps.split(":")) if args.steps else None
        if steps is not None and len(steps) != 2:
            raise ValueError("--steps is a:b")
        print(plot_trace(args.trace, args.png, steps))  # type: ignore[arg-type]
    except (ValueError, OSError) as e:
        print(f"trace_plot: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
