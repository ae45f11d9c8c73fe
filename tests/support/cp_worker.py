"""One rank of a context-parallel run (torchrun's env vars): this rank's share of the rows
(``rows // world`` of them, in rank order), the world's summed loss, every parameter's full
gradient and this rank's forward log-probs, saved for ``tests/engine/test_context_parallel.py``
to compare with one process on the rows all ranks were given."""

from __future__ import annotations

import argparse
import os

import torch

from arealite.engine.context_parallel import gather_rows
from arealite.engine.fsdp_engine import FSDPEngine
from arealite.utils.distributed import all_reduce
from arealite.utils.fsdp import full_tensor
from tests.support.cp_reference import batch, loss_and_grads, make_engine


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cp", type=int, default=2)
    a = ap.parse_args()
    e: FSDPEngine = make_engine(a.model, a.cp)
    data = batch()
    n = data["input_ids"].shape[0] // e.world_size
    mine = {k: v[e.rank * n : (e.rank + 1) * n] for k, v in data.items()}
    rows, _ = gather_rows(mine, e.cp)
    loss, grads = loss_and_grads(e, rows, reduce=lambda t: all_reduce(t, group=e.dp_group))
    grads = {k: full_tensor(g) for k, g in grads.items()}
    logp = e.forward(mine)
    torch.save({"loss": loss, "grads": grads, "logp": logp, "rank": e.rank}, f"{a.out}.{e.rank}")
    torch.distributed.barrier()
    e.destroy()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
