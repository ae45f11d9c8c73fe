"""One rank of the KTO reference-point test: ``python kto_z0_peer.py PORT RANK WORLD OUT``.
Ranks hold different numbers of mismatched rows; each writes the ``z0`` it computed."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def rows(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(policy, reference) log-probabilities of rank ``rank``'s mismatched rows; rank 0's
    mean log-ratio is negative, rank 1's positive, so per-rank clamping would differ."""
    g = torch.Generator().manual_seed(7 + rank)
    n = 3 + 5 * rank
    ref = -torch.rand(n, generator=g, dtype=torch.float64) * 5
    return ref + (2.0 * rank - 0.5) + 0.1 * torch.randn(n, generator=g, dtype=torch.float64), ref


def main() -> None:
    import torch.distributed as dist

    from arealite.engine.preference.losses import kto_reference_point

    port, rank, world, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        Path(out).write_text(json.dumps(kto_reference_point(*rows(rank), dist.group.WORLD)))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
