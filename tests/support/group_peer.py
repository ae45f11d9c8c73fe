"""A stand-in for a server's side of the weight-update group (protocol section 6).

Run as a script: joins the group built by ``init_custom_process_group`` at ``--rank`` and, for
each bucket in ``--specs`` (JSON: a list of buckets, each a list of [name, dtype, shape]),
receives one flattened uint8 broadcast from rank 0, slices it back into tensors exactly as
SGLang's ``FlattenedTensorBucket`` does, and finally ``torch.save``s ``{name: tensor}`` to
``--out``. Used by the tests of ``arealite.utils.distributed`` and of the trainer's upload.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from arealite.utils.distributed import (  # noqa: E402
    destroy_custom_process_group,
    init_custom_process_group,
)


def receive_bucket(pg, bucket: list) -> dict[str, torch.Tensor]:
    sizes = []
    for _name, dtype, shape in bucket:
        item = torch.empty((), dtype=getattr(torch, dtype)).element_size()
        sizes.append(math.prod(shape) * item)
    flat = torch.empty(sum(sizes), dtype=torch.uint8)
    dist.broadcast(flat, src=0, group=pg, async_op=True).wait()
    out, off = {}, 0
    for (name, dtype, shape), n in zip(bucket, sizes):
        dt = getattr(torch, dtype)
        if off % torch.empty((), dtype=dt).element_size():
            raise ValueError(f"Unaligned received tensor {name}")
        out[name] = flat[off : off + n].view(dt).reshape(shape).clone()
        off += n
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--init-method", required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--group-name", required=True)
    ap.add_argument("--specs", required=True, help="JSON file: buckets of [name, dtype, shape]")
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=1, help="updates received over one group")
    ap.add_argument("--timeout", type=float, default=60.0)
    a = ap.parse_args()
    buckets = json.loads(Path(a.specs).read_text())
    pg = init_custom_process_group(
        backend="gloo", init_method=a.init_method, world_size=a.world_size, rank=a.rank,
        group_name=a.group_name, timeout=a.timeout,
    )
    got: list[dict[str, torch.Tensor]] = []
    for _ in range(a.rounds):
        r: dict[str, torch.Tensor] = {}
        for bucket in buckets:
            r.update(receive_bucket(pg, bucket))
        got.append(r)
    torch.save(got, a.out)
    destroy_custom_process_group(pg)


if __name__ == "__main__":
    main()
