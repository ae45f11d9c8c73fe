"""The same model pushed to a live embedded server through shared memory, a gloo broadcast and
disk, side by side in one run, each against the memcpy-bound time for the same bytes; and the
server's RSS before and after ``/release_memory_occupation``.

One random Qwen2 model (built here), one embedded server on it, the trainer an ``FSDPEngine``
(a world of one) driven by the real client (``RemoteInferenceEngine``). Per round, interleaved:

- memcpy: ``dst.copy_(src)`` of one buffer as large as all parameters (the bound);
- shm:    ``upload_by_reference`` alone: every bucket posted to ``/update_weights_from_tensor``
          as SGLang's payload (shared-memory names), the server copying it into its model;
- shm/u:  a whole ``weight_update.type: tensor`` update as the trainer runs it: pause, session,
          the push (buckets staged, applied by the last), end, continue;
- gloo/u: a whole ``distributed`` update (the broadcast group built before the first round);
- disk/u: a whole ``disk`` update (HF safetensors written, the marker, the server's reload).

Verification is off (its cost is measured by ``benchmarks/micro/weight_sync.py``).

    python -m benchmarks.micro.weight_push_modes [--quick] [--rounds N] [--bucket-mb MB]

Goal: shm <= 1.5x memcpy.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")

SIZE = (768, 8, 2048)  # hidden, layers, intermediate: ~225 MB in fp32
QUICK_SIZE = (512, 4, 1536)


def memcpy_seconds(nbytes: int) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8).random_()
    dst = torch.empty_like(src)
    dst.copy_(src)  # touch the pages once
    t0 = time.perf_counter()
    dst.copy_(src)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a smaller model, fewer rounds")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--bucket-mb", type=float, default=64.0)
    a = ap.parse_args()
    rounds = a.rounds or (3 if a.quick else 5)

    from arealite.api.config.actor import TrainEngineConfig
    from arealite.api.config.rollout import InferenceEngineConfig
    from arealite.api.io_struct import WeightUpdateMeta
    from arealite.engine.fsdp_engine import FSDPEngine
    from arealite.rollout.remote_engine import RemoteInferenceEngine
    from arealite.utils.memory import rss_mib
    from arealite.utils.network import LOOPBACK, find_free_port, wait_http_ok
    from arealite.utils.sync_http import post_json
    from arealite.weights.tensor import upload_by_reference
    from benchmarks.micro.weight_sync import build_model

    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        h, n_layers, inter = QUICK_SIZE if a.quick else SIZE
        model_dir = build_model(work / "model", h, n_layers, inter)
        port = find_free_port()
        import subprocess

        server = subprocess.Popen(
            [sys.executable, "-m", "servers.launch_server", "--model-path", str(model_dir),
             "--host", LOOPBACK, "--port", str(port), "--dtype", "float32",
             "--weight-load-root", str(work), "--enable-metrics"], start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        addr = f"{LOOPBACK}:{port}"
        eng = client = None
        try:
            if not wait_http_ok(f"http://{addr}/health", 180, alive=lambda: server.poll() is None):
                raise SystemExit("the server did not start")
            eng = FSDPEngine(TrainEngineConfig(path=str(model_dir), optimizer=None),
                             device="cpu", backend="gloo")
            eng.initialize()
            nbytes = sum(p.numel() * p.element_size() for p in eng.model.parameters())
            client = RemoteInferenceEngine(InferenceEngineConfig(
                server_addrs=[addr], setup_timeout=60, weight_update_timeout=300))
            client.initialize()
            gloo_port, version = find_free_port(), 0
            times: dict[str, list[float]] = {k: [] for k in
                                             ("memcpy", "shm", "shm/u", "gloo/u", "disk/u")}

            applied: list[float] = []  # the server's own time per shm push (check + copy)

            def server_load_seconds() -> float:
                import urllib.request

                with urllib.request.urlopen(f"http://{addr}/metrics", timeout=30) as r:
                    for line in r.read().decode().splitlines():
                        if line.startswith("arealite:weight_update_seconds_total"):
                            return float(line.split()[-1])
                raise RuntimeError("no arealite:weight_update_seconds_total in /metrics")

            def update(meta: WeightUpdateMeta) -> float:
                t0 = time.perf_counter()
                fut = client.update_weights(meta)
                eng.upload_weights(meta)
                fut.result(timeout=600)
                return time.perf_counter() - t0

            def one(mode: str) -> float:
                nonlocal version
                version += 1
                if mode == "memcpy":
                    return memcpy_seconds(nbytes)
                if mode == "shm":
                    meta = WeightUpdateMeta.tensor(version, a.bucket_mb, timeout=300)
                    meta.targets = [addr]  # no client: each bucket applied at once, as in SGLang
                    load0 = server_load_seconds()
                    t0 = time.perf_counter()
                    upload_by_reference(eng.model, meta, 0, 1)
                    secs = time.perf_counter() - t0
                    applied.append(server_load_seconds() - load0)
                    return secs
                if mode == "shm/u":
                    return update(WeightUpdateMeta.tensor(version, a.bucket_mb, timeout=300))
                if mode == "gloo/u":
                    return update(WeightUpdateMeta.broadcast(
                        version, eng.get_param_specs(a.bucket_mb), gloo_port,
                        group_name="bench_push", bucket_size_mb=a.bucket_mb, timeout=300))
                return update(WeightUpdateMeta.disk(version, work / "weights", timeout=300))

            for mode in times:  # warm-up: shared storages, the broadcast group, page cache
                one(mode)
            for _ in range(rounds):
                for mode in times:
                    times[mode].append(one(mode))
            pid = server.pid
            rss0 = rss_mib(pid)
            post_json(addr, "/pause_generation", {"mode": "abort"}, 60)
            t0 = time.perf_counter()
            _, err = post_json(addr, "/release_memory_occupation", {}, 300)
            t_rel = time.perf_counter() - t0
            rss1 = rss_mib(pid)
            t0 = time.perf_counter()
            post_json(addr, "/resume_memory_occupation", {}, 300)
            t_res = time.perf_counter() - t0
            rss2 = rss_mib(pid)
            post_json(addr, "/continue_generation", {}, 60)
        finally:
            if client is not None:
                client.destroy()
            if eng is not None:
                eng.destroy()
            os.killpg(server.pid, 9)
            server.wait()

    mb = nbytes / 2**20
    # x memcpy: the median over rounds of each round's time over the memcpy timed beside it
    # (on a shared machine memory bandwidth moves from one second to the next)
    ratio = {m: statistics.median(t / c for t, c in zip(ts, times["memcpy"]))
             for m, ts in times.items()}
    print(f"weight push modes, {rounds} rounds, {mb:.1f} MB of fp32 parameters, buckets of "
          f"{a.bucket_mb:g} MB, one embedded server (load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores)")
    print(f"{'mode':>7} {'best ms':>9} {'median ms':>10} {'GB/s':>6} {'x memcpy':>9}")
    for mode, ts in times.items():
        best = min(ts)
        print(f"{mode:>7} {best * 1e3:>9.1f} {statistics.median(ts) * 1e3:>10.1f} "
              f"{nbytes / best / 1e9:>6.2f} {ratio[mode]:>9.2f}")
    print("memcpy: the bound (one copy of the same bytes); shm: /update_weights_from_tensor "
          "pushes alone; /u: a whole update as the trainer runs it (pause, session, transfer, "
          "end, continue). x memcpy: median over rounds of (time / memcpy of that round).")
    apply_ratio = statistics.median(t / c for t, c in zip(applied[1:], times["memcpy"]))
    print(f"of a shm push, the server's own work (deserialize, check, copy into the model): "
          f"median {statistics.median(applied[1:]) * 1e3:.1f} ms = {apply_ratio:.2f}x memcpy; "
          "the rest is HTTP and the hand-offs between the two processes")
    goal = ratio["shm"]
    print(f"goal shm <= 1.5x memcpy: {goal:.2f}x -> {'met' if goal <= 1.5 else 'NOT met'}")
    print(f"server RSS: {rss0:.0f} MiB -> release {rss1:.0f} MiB ({rss0 - rss1:.0f} MiB freed, "
          f"{t_rel * 1e3:.0f} ms{'' if err is None else ', ' + err}) -> resume {rss2:.0f} MiB "
          f"({t_res * 1e3:.0f} ms); the weights are {mb:.0f} MiB")


if __name__ == "__main__":
    main()
