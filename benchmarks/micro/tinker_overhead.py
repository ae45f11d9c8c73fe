"""Tinker service overhead: one ``forward_backward`` (cross_entropy, a small batch) through the
service with the official SDK, against the same update called in-process on arealite's
trainer (``arealite.tinker.trainer.TinkerModel.forward_backward``), on the tiny model with a
LoRA adapter of the same rank.

The service runs in its own process (``arealite tinker-server``, over one embedded server that
it needs for weight pushes; no push happens here), single-threaded like the in-process model;
the two paths alternate call by call, so load on the shared machine hits both alike. The
service adds: the SDK (request building, protobuf encoding, its event-loop thread), HTTP both
ways, the future and its long-poll, decoding and encoding on the server.

    python -m benchmarks.micro.tinker_overhead [--quick] [--calls N] [--rows R] [--tokens T]
        [--compare-with CHECKOUT]

``--compare-with`` also starts the service from another checkout of arealite (e.g. the main
branch, to compare a change with its base), on the same embedded server, and alternates all
three paths in one run, so both ratios are measured under the same machine load.

Needs the ``tinker`` SDK (docs/tinker.md). Prints the median of each path and their ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KEY = "tml-benchmark"


def start_service(model: str, addr: str, root: str, port: int,
                   checkout: str | None = None) -> subprocess.Popen:
    """``arealite tinker-server`` on ``port`` over the server at ``addr``, in its own process
    group (the caller kills it); from ``checkout``'s code when given (it runs there, with that
    tree first on PYTHONPATH)."""
    Path(root).mkdir(parents=True, exist_ok=True)
    log_path = Path(root) / "tinker.log"
    log = open(log_path, "w")  # noqa: SIM115 - lives as long as the process
    cmd = [sys.executable, "-m", "arealite.cli.main", "tinker-server", "configs/tinker/tiny.yaml",
           f"model.path={model}", f"rollout.server_addrs=[{addr}]", f"fileroot={root}",
           f"port={port}", f"api_key={KEY}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TINKER_TELEMETRY": "0"}
    cwd = None
    if checkout is not None:
        cwd = str(Path(checkout).resolve())
        env["PYTHONPATH"] = os.pathsep.join([cwd, env.get("PYTHONPATH", "")])
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                            start_new_session=True)
    deadline = time.monotonic() + 600  # generous: start-up imports torch on a busy machine
    while time.monotonic() < deadline and proc.poll() is None:
        if "tinker service at" in log_path.read_text():
            return proc
        time.sleep(0.25)
    os.killpg(proc.pid, 9)
    raise RuntimeError("the tinker service did not start:\n" + log_path.read_text()[-3000:])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer calls (smoke run)")
    p.add_argument("--calls", type=int, default=40)
    p.add_argument("--rows", type=int, default=8, help="datums per forward_backward")
    p.add_argument("--tokens", type=int, default=64, help="tokens per datum")
    p.add_argument("--rank", type=int, default=8, help="LoRA rank")
    p.add_argument("--compare-with", metavar="CHECKOUT", default=None,
                   help="also time the service of another arealite checkout (e.g. /work/main)")
    args = p.parse_args(argv)
    calls = 8 if args.quick else args.calls

    import tinker
    import torch
    from tinker import types

    from arealite.api.config.actor import LoRAConfig, OptimizerConfig, TrainEngineConfig
    from arealite.demo.tiny import build_tiny_model
    from arealite.tinker.trainer import TinkerModel
    from arealite.tinker.wire import Datum
    from arealite.utils.network import find_free_port
    from benchmarks.harness.server_process import Server

    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="tinker_overhead_")
    model = str(build_tiny_model(Path(tmp) / "tiny"))
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(3, 300, (args.tokens + 1,), generator=g).tolist()
            for _ in range(args.rows)]
    sdk_batch = [types.Datum(model_input=types.ModelInput.from_ints(r[:-1]),
                             loss_fn_inputs={"target_tokens": r[1:]}) for r in rows]
    local_batch = [Datum(r[:-1], {"target_tokens": torch.tensor(r[1:])}) for r in rows]
    local = TinkerModel(TrainEngineConfig(path=model, dtype="float32",
                                          optimizer=OptimizerConfig(),
                                          lora=LoRAConfig(rank=args.rank, alpha=2.0 * args.rank)),
                        "cpu", "gloo", seed=1)

    labels = ["this checkout"] + ([args.compare_with] if args.compare_with else [])
    procs: list[subprocess.Popen] = []
    with Server(model, "--enable-lora", "--max-lora-rank", str(args.rank)) as server:
        try:
            clients = []
            for n, checkout in enumerate([None, args.compare_with][:len(labels)]):
                port = find_free_port()
                procs.append(start_service(model, server.addr, f"{tmp}/svc{n}", port, checkout))
                sc = tinker.ServiceClient(base_url=f"http://127.0.0.1:{port}", api_key=KEY)
                clients.append(sc.create_lora_training_client(base_model=model,
                                                              rank=args.rank).result())
            service_s: list[list[float]] = [[] for _ in clients]
            local_s: list[float] = []
            for i in range(calls + 2):  # the first two of each are warm-up
                for tc, times in zip(clients, service_s):
                    t0 = time.perf_counter()
                    tc.forward_backward(sdk_batch, "cross_entropy").result()
                    if i >= 2:
                        times.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                local.forward_backward(local_batch, "cross_entropy", None, False)
                if i >= 2:
                    local_s.append(time.perf_counter() - t0)
        finally:
            for proc in procs:
                os.killpg(proc.pid, 15)
                proc.wait(timeout=30)
    loc = statistics.median(local_s)
    print(f"forward_backward, cross_entropy, {args.rows} datums x {args.tokens} tokens, "
          f"tiny model, LoRA rank {args.rank}, {calls} calls each (medians)")
    print(f"  in-process TinkerModel.forward_backward   {loc * 1e3:8.1f} ms")
    for label, times in zip(labels, service_s):
        svc = statistics.median(times)
        print(f"  service of {label}, tinker SDK over HTTP")
        print(f"      {svc * 1e3:8.1f} ms   ratio service / in-process {svc / loc:5.2f}x "
              f"(overhead {1e3 * (svc - loc):.1f} ms per call)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
