"""Rank 0 of a weight-update group, as a trainer would be: run as a separate process.

    python tests/support/server_weight_sender.py MODEL_DIR PORT WORLD_SIZE GROUP OUT_DIR

Joins the group the way SGLang's trainer side does (servers.weights.loading.init_custom_process_group,
gloo), then broadcasts three rounds of perturbed weights: round 1 one broadcast per tensor, round 2
one flattened uint8 bucket of every tensor, round 3 a smaller bucket of the first half. Each round's tensors are saved to OUT_DIR/round{1,2,3}.pt first, so the
test can compare what the server holds afterwards.
"""

from __future__ import annotations

import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from servers.weights.loading import init_custom_process_group


def main() -> None:
    model_dir, port, world, group, out = sys.argv[1:6]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    names = [n for n, _ in model.named_parameters()]
    pg = init_custom_process_group("gloo", f"tcp://127.0.0.1:{port}", int(world), 0, group,
                                   timeout=timedelta(seconds=60))
    print("joined", flush=True)
    for rnd in (1, 2, 3):
        gen = torch.Generator().manual_seed(rnd)
        tensors = [(n, p.detach() + 0.01 * rnd * torch.randn(p.shape, generator=gen))
                   for n, p in model.named_parameters()]
        if rnd == 3:  # a smaller bucket: the first half of the tensors, into the reused buffer
            tensors = tensors[: len(tensors) // 2]
        torch.save(dict(tensors), f"{out}/round{rnd}.pt")
        if rnd == 1:
            for _, t in tensors:
                dist.broadcast(t, src=0, group=pg)
        else:
            flat = torch.cat([t.flatten().view(torch.uint8) for _, t in tensors])
            dist.broadcast(flat, src=0, group=pg)
        print(f"sent round {rnd} ({len(names)} tensors)", flush=True)
    dist.destroy_process_group(pg)


if __name__ == "__main__":
    main()
