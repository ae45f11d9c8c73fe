"""The device the check runs on: versions, name, memory, and its copy bandwidth (one buffer
copied to another on the device, bytes read plus written per second), which the other parts
set their figures against (the decode bound, the push against a copy of the same bytes).

    python -m benchmarks.gpu_check.device_info --device cuda [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import time


def copy_seconds(nbytes: int, device: str, repeats: int = 5) -> float:
    """Best time of ``repeats`` device-to-device copies of ``nbytes`` (after one warm-up)."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for i in range(repeats + 1):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src)
        if device == "cuda":
            torch.cuda.synchronize()
        if i:
            best = min(best, time.perf_counter() - t0)
    return best


def copy_bandwidth(device: str, nbytes: int) -> float:
    """Bytes read plus written per second by a device-to-device copy of ``nbytes``."""
    return 2 * nbytes / copy_seconds(nbytes, device)


def info(device: str, quick: bool) -> dict:
    import torch
    import transformers

    out: dict = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "device": device,
    }
    nbytes = (64 if quick or device == "cpu" else 1024) * 2**20
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        out.update(
            name=p.name,
            total_mib=p.total_memory // 2**20,
            sms=p.multi_processor_count,
            cuda=torch.version.cuda,
        )
        n = 4096 if quick else 8192
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        a @ a
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(5):
            a @ a
        torch.cuda.synchronize()
        out["bf16_matmul_tflops"] = round(5 * 2 * n**3 / (time.perf_counter() - t0) / 1e12, 1)
    else:
        out["name"] = platform.processor() or platform.machine()
    out["copy_gb_s"] = round(copy_bandwidth(device, nbytes) / 1e9, 1)
    out["copy_bytes"] = nbytes
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", choices=["cuda", "cpu"], required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    res = info(a.device, a.quick)
    for k, v in res.items():
        print(f"{k:>20}: {v}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
