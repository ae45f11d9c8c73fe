"""One rank of the stats-tracker all-reduce test: ``python stats_tracker_peer.py PORT RANK WORLD OUT``.

Each rank records different amounts of data (and rank 1 a key rank 0 never sees); the reduced
result is written as JSON. ``expected(world)`` computes the same numbers with a slow loop over
all ranks' data pooled together.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def data(rank: int) -> dict:
    g = torch.Generator().manual_seed(100 + rank)
    n = 3 + 4 * rank  # ranks hold different token counts
    return {
        "values": torch.randn(2, n, generator=g, dtype=torch.float64),
        "mask": torch.rand(2, n, generator=g) > 0.3,
        "secs": 0.5 + rank,
        "rejected": 2 * rank + 1,
        "staleness": [rank, 0],  # histogram bins differ between ranks
    }


def expected(world: int) -> dict[str, float]:
    picked, n_tokens = [], 0
    for r in range(world):
        d = data(r)
        for x, keep in zip(d["values"].flatten().tolist(), d["mask"].flatten().tolist()):
            if keep:
                picked.append(x)
        n_tokens += int(d["mask"].sum())
    out = {
        "actor/kl/avg": sum(picked) / len(picked),
        "actor/kl/min": min(picked),
        "actor/kl/max": max(picked),
        "actor/n_tokens": float(n_tokens),
        "timeperf/rollout_wait": sum(data(r)["secs"] for r in range(world)) / world,
        "rollout/rejected": float(sum(data(r)["rejected"] for r in range(world))),
        "rollout/lr": 1e-3,
    }
    if world > 1:
        out["only_rank1/x"] = 42.0
    for r in range(world):
        for v in data(r)["staleness"]:
            out[f"rollout/staleness/{v}"] = out.get(f"rollout/staleness/{v}", 0.0) + 1.0
    return out


def main() -> None:
    import torch.distributed as dist

    from arealite.observe.stats_tracker import ReduceType, StatsTracker

    port, rank, world, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        d = data(rank)
        t = StatsTracker()
        with t.scope("actor"):
            t.denominator(n_tokens=d["mask"])
            t.stat(denominator="n_tokens", kl=d["values"])
        with t.scope("timeperf"):
            t.scalar(reduce_type=ReduceType.SUM_PER_RANK, rollout_wait=d["secs"] - 0.25)
            t.scalar(reduce_type=ReduceType.SUM_PER_RANK, rollout_wait=0.25)
        with t.scope("rollout"):
            t.scalar(reduce_type=ReduceType.SUM, rejected=d["rejected"])
            t.scalar(lr=1e-3)
            t.count_values("staleness", d["staleness"])
        if rank == 1:
            with t.scope("only_rank1"):
                t.scalar(x=42.0)
        Path(out).write_text(json.dumps(t.export()))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
