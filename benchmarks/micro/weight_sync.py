"""Weight sync cost: distributed broadcast and disk versus an in-memory copy of the same bytes.

For two model sizes (random Qwen2 models built here), the trainer is an ``FSDPEngine`` (a world
of one) and the receiver a separate process that joins the weight-update group exactly as a
server does and unpacks each ``flattened_bucket`` into tensors. Measured side by side, per size:

- copy:   ``dst.copy_(src)`` of one buffer as large as all parameters (memory-bandwidth bound);
- bare:   one gloo broadcast of a preallocated buffer of all the bytes (the transport alone);
- bare/b: the same buckets broadcast from preallocated buffers, the receiver allocating each
          bucket anew (as the server did before it reused one receive buffer per group);
- bcast:  ``engine.upload_weights(meta)`` (gather, flatten, one broadcast per bucket) until the
          receiver, running the server's ``receive_broadcast`` with its reused buffer,
          acknowledges it has unpacked every bucket;
- disk:   ``engine.upload_weights(meta)`` of type disk (HF safetensors + marker), plus the
          reader's ``safetensors`` load of the directory;
- verify: the cost of ``weight_update.verify``: bcast with ``meta.verify`` (the trainer hashes
          each bucket while it is on the wire; rounds interleaved with plain ones) minus bcast,
          plus the server's ``/weights_checker`` work (SHA-256 of every parameter, timed here
          on the same tensors).

The fixed overhead and per-byte cost of the broadcast come from a straight line through the two
sizes. Also prints the packing efficiency of micro-batches built from the toy task's batches.

    python -m benchmarks.micro.weight_sync [--quick] [--rounds N] [--bucket-mb MB]

Targets: broadcast <= 2x the copy bound plus a fixed overhead under 50 ms; packing >= 0.95.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from arealite.weights.verify import tensor_checksum

os.environ.setdefault("OMP_NUM_THREADS", "1")

SIZES = {  # name: (hidden, layers, intermediate)
    "small": (256, 4, 768),
    "large": (768, 8, 2048),
}
QUICK_SIZES = {"small": (128, 2, 384), "large": (512, 4, 1536)}


def build_model(out: Path, hidden: int, layers: int, inter: int) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=512, hidden_size=hidden, intermediate_size=inter,
                      num_hidden_layers=layers, num_attention_heads=max(1, hidden // 64),
                      num_key_value_heads=max(1, hidden // 128), tie_word_embeddings=False,
                      max_position_embeddings=256)
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).save_pretrained(str(out))
    return out


# ----------------------------------------------------------------------------- receiver


def receiver(init: str, group: str, specs_path: str, rounds: int,
             upload_rounds: int | None = None) -> None:
    from arealite.utils.distributed import destroy_custom_process_group, init_custom_process_group
    from servers.weights.loading import BucketBuffer, receive_broadcast

    buckets = json.loads(Path(specs_path).read_text())
    pg = init_custom_process_group("gloo", init, world_size=2, rank=1, group_name=group,
                                   timeout=300)
    ack = torch.zeros(1, dtype=torch.uint8)
    buf = BucketBuffer()
    for _ in range(upload_rounds or rounds):  # plain and verified uploads, interleaved
        for b in buckets:  # receive and unpack exactly as a server does
            names, dtypes, shapes = zip(*b)
            receive_broadcast(pg, list(names), list(dtypes), [list(s) for s in shapes],
                              "flattened_bucket", torch.device("cpu"), buf)
        dist.broadcast(ack, src=1, group=pg)  # "every bucket is in"
    for _ in range(rounds):  # bare, bucketed: the same buckets and allocations, no trainer code
        for b in buckets:
            nb = sum(math.prod(s) * getattr(torch, d).itemsize for _, d, s in b)
            dist.broadcast(torch.empty(nb, dtype=torch.uint8), src=0, group=pg)
        dist.broadcast(ack, src=1, group=pg)
    total = sum(math.prod(s) * torch.empty((), dtype=getattr(torch, d)).element_size()
                for b in buckets for _, d, s in b)
    raw = torch.empty(total, dtype=torch.uint8)
    for _ in range(rounds):  # the bare transport: one preallocated buffer, no unpacking
        dist.broadcast(raw, src=0, group=pg)
        dist.broadcast(ack, src=1, group=pg)
    destroy_custom_process_group(pg)


# ----------------------------------------------------------------------------- trainer


def copy_seconds(nbytes: int, rounds: int) -> list[float]:
    src = torch.empty(nbytes, dtype=torch.uint8).random_()
    dst = torch.empty_like(src)
    dst.copy_(src)  # touch the pages once
    ts = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        dst.copy_(src)
        ts.append(time.perf_counter() - t0)
    return ts


def measure(model_dir: Path, rounds: int, bucket_mb: float, work: Path) -> dict[str, float]:
    from safetensors.torch import load_file

    from arealite.api.config.actor import TrainEngineConfig
    from arealite.api.io_struct import WeightUpdateMeta
    from arealite.engine.fsdp_engine import FSDPEngine
    from arealite.utils.network import find_free_port

    eng = FSDPEngine(TrainEngineConfig(path=str(model_dir), optimizer=None), device="cpu",
                     backend="gloo")
    eng.initialize()
    specs = eng.get_param_specs(bucket_mb)
    nbytes = sum(s.nbytes for b in specs for s in b)
    spec_file = work / f"{model_dir.name}_specs.json"
    spec_file.write_text(json.dumps([[[s.name, s.dtype, list(s.shape)] for s in b] for b in specs]))
    port = find_free_port()
    group = f"bench_{model_dir.name}"
    peer = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.micro.weight_sync", "--peer", f"tcp://127.0.0.1:{port}",
         "--group", group, "--specs", str(spec_file), "--rounds", str(rounds + 1),
         "--upload-rounds", str(2 * rounds + 1)],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True,
    )
    try:
        ack = torch.zeros(1, dtype=torch.uint8)
        bcast, bcast_v = [], []
        for r in range(2 * rounds + 1):  # round 0 builds the group and warms up
            meta = WeightUpdateMeta(type="distributed", version=r + 1, master_port=port,
                                    group_name=group, timeout=300, verify=r % 2 == 0)
            meta.param_specs, meta.world_size = specs, 2
            t0 = time.perf_counter()
            eng.upload_weights(meta)
            dist.broadcast(ack, src=1, group=eng._uploader.pg)
            if r:
                (bcast_v if meta.verify else bcast).append(time.perf_counter() - t0)
        # bare, bucketed: one preallocated buffer per bucket, one broadcast each; the receiver
        # allocates every bucket anew
        bufs = [torch.empty(sum(s.nbytes for s in b), dtype=torch.uint8).random_() for b in specs]
        raw_b = []
        for _ in range(rounds + 1):
            t0 = time.perf_counter()
            for b in bufs:
                dist.broadcast(b, src=0, group=eng._uploader.pg)
            dist.broadcast(ack, src=1, group=eng._uploader.pg)
            raw_b.append(time.perf_counter() - t0)
        del bufs
        raw, buf = [], torch.empty(nbytes, dtype=torch.uint8).random_()
        for _ in range(rounds + 1):
            t0 = time.perf_counter()
            dist.broadcast(buf, src=0, group=eng._uploader.pg)
            dist.broadcast(ack, src=1, group=eng._uploader.pg)
            raw.append(time.perf_counter() - t0)
        peer.wait(timeout=60)
    finally:
        if peer.poll() is None:
            peer.kill()
    disk_w, disk_r = [], []
    for r in range(rounds):
        meta = WeightUpdateMeta(type="disk", version=r + 1, path=str(work / f"{model_dir.name}_d{r}"))
        t0 = time.perf_counter()
        eng.upload_weights(meta)
        t1 = time.perf_counter()
        sd = load_file(os.path.join(meta.path, "model.safetensors"))
        disk_w.append(t1 - t0)
        disk_r.append(time.perf_counter() - t1)
        del sd
    server_sums = []  # the server's /weights_checker work on the same tensors
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _, p in eng.model.named_parameters():
            tensor_checksum(p.detach().full_tensor() if hasattr(p, "full_tensor") else p)
        server_sums.append(time.perf_counter() - t0)
    eng.destroy()
    copies = copy_seconds(nbytes, rounds)
    return {
        "mb": nbytes / 2**20, "n_buckets": len(specs), "copy": min(copies),
        "bcast": min(bcast), "bcast_med": statistics.median(bcast), "raw": min(raw[1:]),
        "raw_b": min(raw_b[1:]),
        "disk_write": min(disk_w), "disk_read": min(disk_r),
        "bcast_v": min(bcast_v), "server_sums": min(server_sums),
    }


def packing_figures(quick: bool) -> None:
    from transformers import AutoTokenizer

    from arealite.demo.tiny import build_tiny_model
    from arealite.demo.toy_math import generate_toy_math
    from arealite.engine.packing import packing_efficiency, split_into_micro_batches
    from arealite.engine.sft.lm_engine import build_sft_batch

    with tempfile.TemporaryDirectory() as d:
        tok = AutoTokenizer.from_pretrained(str(build_tiny_model(Path(d))))
    rows = generate_toy_math(64 if quick else 512, seed=0)
    B = 64
    print("\npacking efficiency on toy-task batches (prompt + answer, batch of 64 rows):")
    print(f"{'budget':>8} {'n_mbs':>6} {'padded [B,S]':>13} {'packed':>7} {'budget fill':>12}")
    packed_all = []
    for budget in (256, 512, 1024, 4096):
        pads, packs, fills, n = [], [], [], []
        for s in range(0, len(rows), B):
            chunk = rows[s: s + B]
            batch = build_sft_batch(tok, [r["question"] for r in chunk], [r["answer"] for r in chunk])
            am = batch["attention_mask"]
            pads.append(float(am.sum()) / am.numel())
            mbl = split_into_micro_batches(batch, budget)
            packs.append(packing_efficiency(mbl, "packed"))
            fills.append(packing_efficiency(mbl, "budget", budget))
            n.append(len(mbl))
        packed_all += packs
        print(f"{budget:>8} {statistics.mean(n):>6.1f} {statistics.mean(pads):>13.3f} "
              f"{statistics.mean(packs):>7.3f} {statistics.mean(fills):>12.3f}")
    print("padded = real / (B x longest row); packed = real / tokens the model runs (one row per"
          " micro-batch, no padding); budget fill = real / (n_mbs x budget), FFD's bin fill.")
    print(f"packing efficiency (packed, worst budget): {min(packed_all):.3f} (target >= 0.95)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller models, fewer rounds")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--bucket-mb", type=float, default=64.0)
    ap.add_argument("--peer", help=argparse.SUPPRESS)
    ap.add_argument("--group", help=argparse.SUPPRESS)
    ap.add_argument("--specs", help=argparse.SUPPRESS)
    ap.add_argument("--upload-rounds", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.peer:
        receiver(a.peer, a.group, a.specs, a.rounds, a.upload_rounds)
        return
    rounds = a.rounds or (3 if a.quick else 5)
    sizes = QUICK_SIZES if a.quick else SIZES
    res = {}
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        for name, (h, n_layers, inter) in sizes.items():
            res[name] = measure(build_model(work / name, h, n_layers, inter), rounds,
                                a.bucket_mb, work)
    print(f"weight sync, best of {rounds} rounds, buckets of {a.bucket_mb:g} MB, gloo on loopback"
          f" (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    print(f"{'model':>6} {'MB':>7} {'bkts':>4} {'copy ms':>8} {'bare ms':>8} {'bare/b ms':>10} "
          f"{'upload ms':>10} {'(median)':>9} {'disk w+r ms':>12}")
    for name, r in res.items():
        disk = r["disk_write"] + r["disk_read"]
        print(f"{name:>6} {r['mb']:>7.1f} {r['n_buckets']:>4d} {r['copy'] * 1e3:>8.1f} "
              f"{r['raw'] * 1e3:>8.1f} {r['raw_b'] * 1e3:>10.1f} {r['bcast'] * 1e3:>10.1f} "
              f"{r['bcast_med'] * 1e3:>9.1f} {disk * 1e3:>12.1f}")
    print(f"\n{'model':>6} {'upload/bare':>12} {'upload/bare-b':>14} {'bare/copy':>10} "
          f"{'upload/copy':>12} {'disk/copy':>10}")
    for name, r in res.items():
        disk = r["disk_write"] + r["disk_read"]
        print(f"{name:>6} {r['bcast'] / r['raw']:>12.2f} {r['bcast'] / r['raw_b']:>14.2f} "
              f"{r['raw'] / r['copy']:>10.1f} {r['bcast'] / r['copy']:>12.1f} "
              f"{disk / r['copy']:>10.1f}")
    print("copy: memcpy of the same bytes (the memory-bandwidth bound); bare: one gloo broadcast of"
          " one preallocated buffer; bare/b: the same buckets broadcast from preallocated buffers,"
          " the receiver allocating each bucket anew; upload: engine.upload_weights until the"
          " receiver (the server's receive_broadcast, one reused buffer) has unpacked every"
          " bucket. upload/bare is our code's overhead over the transport; bare/copy is the"
          " transport's own cost.")
    s, lg = res["small"], res["large"]
    dm = (lg["mb"] - s["mb"])
    slope_b = (lg["bcast"] - s["bcast"]) / dm
    slope_c = max(lg["copy"] - s["copy"], 1e-9) / dm
    slope_r = (lg["raw"] - s["raw"]) / dm
    overhead = s["bcast"] - slope_b * s["mb"]
    print(f"upload fit: {overhead * 1e3:.1f} ms fixed + {slope_b * 1e3:.3f} ms/MB; bare gloo "
          f"{slope_r * 1e3:.3f} ms/MB; copy {slope_c * 1e3:.3f} ms/MB; per-byte upload/copy = "
          f"{slope_b / slope_c:.1f}x, upload/bare = {slope_b / max(slope_r, 1e-9):.2f}x")
    print(f"per-byte upload/copy: {slope_b / slope_c:.2f}x (target <= 2x)")
    print(f"upload fixed overhead: {overhead * 1e3:.1f} ms (target < 50 ms)")
    print("With NCCL on GPUs the same code path runs (backend and device are configuration):"
          " the bucket is packed on the GPU and an NCCL broadcast over NVLink/PCIe runs near the"
          " device-copy bound, so bare/copy drops from gloo's loopback TCP cost to ~1-2x and the"
          " upload/copy target becomes reachable; here gloo over loopback alone is several x the"
          " copy on 2 shared cores.")
    print(f"\n{'model':>6} {'upload ms':>10} {'+verify ms':>11} {'server sums ms':>15} "
          f"{'verify cost':>12}")
    for name, r in res.items():
        extra = max(r["bcast_v"] - r["bcast"], 0.0) + r["server_sums"]
        print(f"{name:>6} {r['bcast'] * 1e3:>10.1f} {r['bcast_v'] * 1e3:>11.1f} "
              f"{r['server_sums'] * 1e3:>15.1f} {extra / r['bcast']:>11.0%}")
    print("verify cost: (upload with meta.verify - upload) + the server's checksum pass, over the"
          " upload; the client's comparison of two dicts is negligible.")
    packing_figures(a.quick)


if __name__ == "__main__":
    main()
