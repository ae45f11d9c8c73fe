"""One LoRA adapter pushed to a live, busy embedded server three ways, side by side in one run.

    python -m benchmarks.studies.lora_push_modes [--rounds N] [--fileroot outputs]

The main job's SFT warm-start model (built as ``make run`` builds it), one embedded server with
``--enable-lora``, a trainer ``FSDPEngine`` with a rank-16 adapter (a world of one) driven by the
real client (``RemoteInferenceEngine``), and two background threads keeping the server generating
(64-token requests, one after another). Per round, interleaved after one warm-up round each:

- disk:        the adapter written in peft's format, ``/load_lora_adapter``, nothing paused;
- tensor:      the adapter handed over in memory (``/load_lora_adapter_from_tensors`` by
               shared-memory reference), nothing paused;
- disk-pause:  ``/pause_generation`` (abort) → ``/load_lora_adapter`` → ``/continue_generation``
               (``weight_update.lora_pause``), the path full weights take.

Figures: seconds per push (median, the whole update as the trainer runs it) and background
requests cut by an abort per push.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

MODES = ("disk", "tensor", "disk-pause")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--fileroot", default="outputs")
    a = ap.parse_args(argv)

    import requests

    from arealite.api.config.actor import LoRAConfig, TrainEngineConfig
    from arealite.api.config.rollout import InferenceEngineConfig
    from arealite.api.io_struct import WeightUpdateMeta
    from arealite.engine.fsdp_engine import FSDPEngine
    from arealite.rollout.remote_engine import RemoteInferenceEngine
    from arealite.utils.network import LOOPBACK, find_free_port, wait_http_ok
    from benchmarks.harness.warm_start import ensure_model

    model, _ = ensure_model(Path(a.fileroot))
    work = Path(a.fileroot) / "bench-lora-push-modes"
    work.mkdir(parents=True, exist_ok=True)
    port = find_free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "servers.launch_server", "--model-path", str(model), "--host",
         LOOPBACK, "--port", str(port), "--enable-lora", "--weight-load-root", str(work)],
        start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    addr = f"{LOOPBACK}:{port}"
    stop = threading.Event()
    cut = [0]
    eng = client = None
    try:
        if not wait_http_ok(f"http://{addr}/health", 180, alive=lambda: server.poll() is None):
            raise SystemExit("the server did not start")
        eng = FSDPEngine(TrainEngineConfig(path=str(model), optimizer=None,
                                           lora=LoRAConfig(rank=16, alpha=32)),
                         device="cpu", backend="gloo")
        eng.initialize()
        client = RemoteInferenceEngine(InferenceEngineConfig(
            server_addrs=[addr], setup_timeout=60, weight_update_timeout=120,
            max_head_offpolicyness=1, pause_mode="abort"))
        client.initialize()

        def busy() -> None:
            while not stop.is_set():
                r = requests.post(f"http://{addr}/generate", timeout=120, json={
                    "input_ids": [5, 6, 7, 8], "sampling_params": {
                        "max_new_tokens": 64, "ignore_eos": True, "temperature": 1.0}})
                if r.ok and r.json()["meta_info"]["finish_reason"]["type"] == "abort":
                    cut[0] += 1

        threads = [threading.Thread(target=busy, daemon=True) for _ in range(2)]
        for t in threads:
            t.start()
        version = 0
        times: dict[str, list[float]] = {m: [] for m in MODES}
        cuts: dict[str, list[int]] = {m: [] for m in MODES}

        def push(mode: str) -> tuple[float, int]:
            nonlocal version
            version += 1
            if mode == "tensor":
                meta = WeightUpdateMeta.tensor(version, timeout=120)
            else:
                meta = WeightUpdateMeta.disk(version, work / "weights", timeout=120)
            meta.lora_name, meta.lora_pause = f"bench-v{version}", mode == "disk-pause"
            before = cut[0]
            t0 = time.perf_counter()
            fut = client.update_weights(meta)
            eng.upload_weights(meta)
            fut.result(timeout=120)
            secs = time.perf_counter() - t0
            client.set_version(version)
            time.sleep(0.3)  # let requests cut by the pause come back and be counted
            return secs, cut[0] - before

        for mode in MODES:  # warm-up: shared memory, page cache, first loads
            push(mode)
        for _ in range(a.rounds):
            for mode in MODES:
                secs, n = push(mode)
                times[mode].append(secs)
                cuts[mode].append(n)
        print(f"\n{a.rounds} rounds, interleaved, server busy with 2 request streams\n")
        print("| push | s per push (median) | min | max | requests cut per push (mean) |")
        print("|---|---|---|---|---|")
        for m in MODES:
            print(f"| {m} | {statistics.median(times[m]):.4f} | {min(times[m]):.4f} | "
                  f"{max(times[m]):.4f} | {statistics.fmean(cuts[m]):.2f} |")
        d = statistics.median(times["disk"])
        for m in ("tensor", "disk-pause"):
            print(f"\n{m} / disk: seconds per push {statistics.median(times[m]) / d:.2f}x")
    finally:
        stop.set()
        if client is not None:
            client.destroy()
        if eng is not None:
            eng.destroy()
        os.killpg(server.pid, 15)
        server.wait(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
