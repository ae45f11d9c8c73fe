"""Long micro-batches: one PPO update's peak memory and tokens/s, dense LM head vs the fused head
(``TrainEngineConfig.logprob_head``), with and without activation checkpointing, one rank vs a
context-parallel group (``context_parallel_size``), for token budgets doubling from 4,096.

Each point (budget x head x checkpointing x cp) is one ``FSDPPPOActor`` running ``ppo_update`` on a
batch that fills exactly one micro-batch of ``budget`` tokens (rows of ``--seq-len`` tokens;
0: a single trace of the whole budget), behaviour log-probs as the proximal policy (no
recompute forward: the update alone). ``--updates`` updates run (2 by default); the last is
timed.

Memory, said plainly because it differs by device:

- CPU: the growth of the process's peak resident set over the updates (``VmHWM`` after,
  reset through ``/proc/self/clear_refs`` just before, minus ``VmRSS`` then), in MiB: what the
  update adds on top of weights, optimizer and batch;
- CUDA: ``torch.cuda.max_memory_allocated`` over the updates, in GiB: the whole footprint
  (weights, gradients, optimizer included), as prime-rl reports its peaks.

Every point runs in fresh processes (``--point``), so one point's freed-but-cached memory never
hides the next one's; dense and fused, cp = 1 and cp > 1 alternate at each budget so machine
load hits them alike. A cp > 1 point is a torchrun group of cp ranks on this host (gloo on CPU,
each rank with ``cpu_count / cp`` threads; NCCL and one GPU per rank on CUDA), each handed its
own rows of the batch as in training (so ``--seq-len`` must make at least cp rows), the group
training on all of them with every micro-batch's tokens split over it; its peak is the largest
rank's, its tokens/s the group's tokens over the slowest rank's seconds.
A point that fails (out of memory) ends that configuration's column.

    python -m benchmarks.micro.long_context                          # CPU: tiny model, Qwen vocab
    python -m benchmarks.micro.long_context --device cuda --model qwen3-0.6b \\
        --budgets 4096,8192,16384,32768,65536 --seq-len 0            # GPU: Qwen3-0.6B shape, bf16
    python -m benchmarks.micro.long_context --budgets 4096 --seq-len 3072 --cp 1,2  # cp axis

Models are built from a config (no download, ``benchmarks.harness.model_shapes``): ``tiny-vocab``
has Qwen's 151,936-token vocabulary (tied embeddings) over a 64-wide, 2-layer body, so the head
dominates as it does for long traces of small models; ``qwen3-0.6b`` is Qwen3-0.6B's published
shape. CPU runs fp32; CUDA runs bf16 compute over fp32 master weights (FSDP2 mixed precision).

Targets (issue 34), CPU at 8,192 tokens: fused peak <= 0.25x dense, fused tokens/s >= 0.9x dense;
cp = 2 per-rank peak <= 0.6x cp = 1's at the largest budget both can run.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness.model_shapes import config_dir, model_flops
from benchmarks.harness.paths import ROOT, results_dir

RESULTS = results_dir("long_context")
MODELS = ("tiny-vocab", "qwen3-0.6b")  # shapes of benchmarks.harness.model_shapes


def trace_batch(budget: int, seq_len: int, vocab: int, seed: int = 0) -> dict:
    """Rows of ``seq_len`` tokens (the last one shorter) summing to ``budget``: a 64-token prompt,
    the rest generated, random behaviour log-probs and rewards."""
    from arealite.api.trajectory import pad_sequences_to_tensors

    rng = random.Random(seed)
    lens, left = [], budget
    while left > 0:
        lens.append(min(left, seq_len or budget))
        left -= lens[-1]
    rows = []
    for L in lens:
        p = min(64, L // 2)
        rows.append(
            {
                "input_ids": [rng.randint(3, vocab - 1) for _ in range(L)],
                "loss_mask": [0] * p + [1] * (L - p),
                "logprobs": [0.0] * p + [-rng.uniform(0.5, 4.0) for _ in range(L - p)],
                "versions": [-1] * p + [0] * (L - p),
                "rewards": float(rng.random() < 0.5),
            }
        )
    return pad_sequences_to_tensors(rows)


def _status_kib(key: str) -> int:
    return int(re.search(rf"{key}:\s+(\d+)", Path("/proc/self/status").read_text()).group(1))


def run_point(
    model_dir: Path,
    device: str,
    budget: int,
    head: str,
    ckpt: bool,
    seq_len: int,
    chunk: int,
    updates: int = 2,
    attn: str = "auto",
    cp: int = 1,
) -> dict:
    """One configuration in this process: ``updates`` PPO updates, the last one timed. With
    ``cp > 1`` this process is one rank of a cp group (torchrun's environment): it is given rows
    ``rank, rank + cp, ...`` of the batch (with one trace, rank 0 has it and the others none),
    the group trains on all of them, each rank holding ``1 / cp`` of the micro-batch's tokens."""
    import torch

    from arealite.api.config.actor import MixedPrecisionConfig, OptimizerConfig, PPOActorConfig
    from arealite.api.io_struct import FinetuneSpec
    from arealite.engine.ppo.actor import FSDPPPOActor

    cuda = device == "cuda"
    cfg = PPOActorConfig(
        path=str(model_dir),
        init_from_scratch=True,
        dtype="float32",
        group_size=1,
        max_tokens_per_mb=budget,
        recompute_logprob=False,
        use_decoupled_loss=False,
        adv_norm=True,
        logprob_head=head,
        logprob_chunk_size=chunk,
        gradient_checkpointing=ckpt,
        attn_impl=attn,
        context_parallel_size=cp,
        mixed_precision=MixedPrecisionConfig(param_dtype="bfloat16" if cuda else "float32"),
        optimizer=OptimizerConfig(lr=1e-6, weight_decay=0.0, gradient_clipping=1.0),
    )
    actor = FSDPPPOActor(cfg, device=device, backend="nccl" if cuda else "gloo")
    actor.initialize(ft_spec=FinetuneSpec(1, 1 << 20, 16))
    hf = actor.hf_config
    full = trace_batch(budget, seq_len, hf.vocab_size)
    lens = full["attention_mask"].sum(1).tolist()  # the group's rows
    own = torch.arange(actor.rank, len(lens), actor.world_size)
    batch = {k: v[own] for k, v in full.items()}
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    else:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    base = _status_kib("VmRSS")
    secs = []
    for _ in range(max(1, updates)):
        data = dict(batch)
        actor.compute_advantages(data)
        sync()
        t = time.perf_counter()
        actor.ppo_update(data)
        sync()
        secs.append(time.perf_counter() - t)
    if cuda:
        peak = torch.cuda.max_memory_allocated() / 2**30
    else:
        peak = (_status_kib("VmHWM") - base) / 1024
    n_params = sum(p.numel() for p in actor.model.parameters())
    actor.destroy()
    return {
        "budget": budget,
        "head": head,
        "ckpt": ckpt,
        "cp": cp,
        "rank": actor.rank,
        "threads": torch.get_num_threads(),
        "tokens": sum(lens),
        "rows": len(lens),
        "seconds": secs[-1],
        "tokens_per_s": sum(lens) / secs[-1],
        "peak": peak,
        "peak_unit": "GiB allocated" if cuda else "MiB RSS growth",
        "n_params": n_params,
        "flops": model_flops(hf, n_params, lens),
    }


def _spawn_point(
    args, model_dir: Path, budget: int, head: str, ckpt: bool, cp: int, failed: list
) -> dict | None:
    """One point in fresh processes: one, or with ``cp > 1`` a torchrun group of ``cp`` ranks
    on this host, each with ``cpu_count / cp`` CPU threads so both forms use the same cores.
    The point's figures are the group's: its tokens, the slowest rank's seconds, the largest
    rank's peak (``peaks`` lists every rank's)."""
    point = [
        "-m",
        "benchmarks.micro.long_context",
        "--point",
        f"{budget},{head},{int(ckpt)},{cp}",
        "--model-dir",
        str(model_dir),
        "--device",
        args.device,
        "--seq-len",
        str(args.seq_len),
        "--chunk",
        str(args.chunk),
        "--updates",
        str(args.updates),
        "--attn",
        args.attn,
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if args.device == "cpu":
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // cp))
    if cp == 1:
        cmd = [sys.executable, *point]
    else:
        from arealite.utils.network import find_free_port

        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={cp}",
            "--master-addr=127.0.0.1",
            f"--master-port={find_free_port()}",
            *point,
        ]
    # a point past --point-timeout (a rank stuck in a collective, say) is killed with every
    # process it started
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=str(ROOT)
    )
    try:
        out, err = proc.communicate(timeout=args.point_timeout)
        late = False
    except subprocess.TimeoutExpired:
        _kill_tree(proc.pid)
        out, err = proc.communicate()
        late = True
    ranks = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    if proc.returncode == 0 and len(ranks) == cp:
        return _combine(ranks)
    # -9 (or torchrun's "Signal 9"): the kernel's out-of-memory killer, a CPU point larger
    # than the free memory
    oom = proc.returncode == -9 or "Signal 9 (SIGKILL)" in err
    errors = [x for x in err.splitlines() if "Error" in x] or err.splitlines() or ["?"]
    why = (
        f"timed out after {args.point_timeout:.0f} s"
        if late
        else "killed (out of memory)"
        if oom
        else errors[-1].strip()[:200]
    )
    rc = proc.returncode
    failed.append({"budget": budget, "head": head, "ckpt": ckpt, "cp": cp, "rc": rc, "why": why})
    print(f"  point {budget} {head} ckpt={int(ckpt)} cp={cp} failed (rc {rc}): {why}", flush=True)
    return None


def _kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and its descendants: torchrun starts its workers in sessions of their
    own, so a process group would miss them."""
    import psutil

    with contextlib.suppress(psutil.NoSuchProcess):
        root = psutil.Process(pid)
        for p in [*root.children(recursive=True), root]:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()


def _combine(ranks: list[dict]) -> dict:
    """A cp group's point from its ranks' rows (one rank: that row)."""
    row = dict(max(ranks, key=lambda r: r["seconds"]))
    row["peaks"] = [r["peak"] for r in sorted(ranks, key=lambda r: r["rank"])]
    row["peak"] = max(row["peaks"])
    row.pop("rank")
    return row


def table(rows: list[dict], peak_tflops: float | None) -> str:
    unit = rows[0]["peak_unit"] if rows else ""
    out = [
        f"{'budget':>7} {'ckpt':>4} {'head':>5} {'cp':>2} {'s/update':>9} {'tokens/s':>9} "
        f"{'peak':>9} {'MFU':>6}   peak = {unit}, per rank (the largest)"
    ]
    by = {(r["budget"], r["ckpt"], r["head"], r.get("cp", 1)): r for r in rows}
    for r in rows:
        mfu = (
            f"{r['flops'] / r['seconds'] / (peak_tflops * 1e12):6.1%}" if peak_tflops else "     -"
        )
        out.append(
            f"{r['budget']:>7} {int(r['ckpt']):>4} {r['head']:>5} {r.get('cp', 1):>2} "
            f"{r['seconds']:9.2f} {r['tokens_per_s']:9.0f} {r['peak']:9.1f} {mfu}"
        )
    fused, cps = [], []
    for (b, c, h, n), r in sorted(by.items()):
        d = by.get((b, c, "dense", n))
        if h == "fused" and d:
            fused.append(
                # a CPU smoke run's peak can read 0 MB (under the allocator's resolution): no ratio
                f"{b:>7} ckpt={int(c)} cp={n}: fused/dense peak "
                f"{format(r['peak'] / d['peak'], '.3f') if d['peak'] else '-'}, "
                f"tokens/s {r['tokens_per_s'] / d['tokens_per_s']:.2f}"
            )
        one = by.get((b, c, h, 1))
        if n > 1 and one:
            cps.append(
                f"{b:>7} ckpt={int(c)} {h}: cp={n}/cp=1 per-rank peak "
                f"{r['peak'] / one['peak']:.3f}, tokens/s {r['tokens_per_s'] / one['tokens_per_s']:.2f}"
            )
    if fused:
        out += ["", "fused against dense:", *fused]
    if cps:
        out += ["", "context parallel against one rank:", *cps]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--model", default="tiny-vocab", choices=MODELS)
    ap.add_argument("--budgets", default="4096,8192", help="token budgets, comma-separated")
    ap.add_argument("--heads", default="dense,fused")
    ap.add_argument("--ckpt", default="0,1", help="activation checkpointing off/on: 0,1")
    ap.add_argument(
        "--cp",
        default="1",
        help="context_parallel_size values, comma-separated (cp > 1: a torchrun group of cp "
        "ranks on this host; on CUDA one GPU per rank)",
    )
    ap.add_argument("--seq-len", type=int, default=1024, help="tokens per row; 0: one trace")
    ap.add_argument("--chunk", type=int, default=1024, help="fused head's tokens per chunk")
    ap.add_argument(
        "--attn",
        default="auto",
        help="the engine's attn_impl (auto: flash attention on CUDA when installed, else segments)",
    )
    ap.add_argument(
        "--updates",
        type=int,
        default=2,
        help="PPO updates per point, the last timed (1 on a slow CPU: the first "
        "update differs only by creating AdamW's state)",
    )
    ap.add_argument(
        "--in-process",
        action="store_true",
        help="run points in this process (smoke test: memory figures then include "
        "what earlier points left cached)",
    )
    ap.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="for MFU (H100 SXM dense bf16: 989); default: 989 on CUDA, none on CPU",
    )
    ap.add_argument(
        "--json",
        default=None,
        help="results file (default: benchmarks/results/"
        "long_context/long_context_<device>_<model>.json)",
    )
    ap.add_argument(
        "--point-timeout",
        type=float,
        default=3600.0,
        help="seconds one point may take before its processes are killed (the point fails)",
    )
    ap.add_argument("--point", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.point:  # child: one configuration (one rank of it), one JSON line
        b, h, c, n = args.point.split(",")
        print(
            json.dumps(
                run_point(
                    Path(args.model_dir),
                    args.device,
                    int(b),
                    h,
                    c == "1",
                    args.seq_len,
                    args.chunk,
                    args.updates,
                    args.attn,
                    int(n),
                )
            ),
            flush=True,
        )
        return 0
    peak_tflops = args.peak_tflops or (989.0 if args.device == "cuda" else None)
    budgets = [int(x) for x in args.budgets.split(",")]
    heads = args.heads.split(",")
    ckpts = [c == "1" for c in args.ckpt.split(",")]
    cps = [int(c) for c in args.cp.split(",")]
    if args.in_process and cps != [1]:
        print("--in-process runs one rank: it cannot serve --cp > 1", file=sys.stderr)
        return 2
    # each rank of a cp group is handed its own rows (as in training), and a PPO update needs
    # at least one row on every rank
    few = [b for b in budgets if -(-b // (args.seq_len or b)) < max(cps)]
    if few:
        print(
            f"--cp {max(cps)} needs at least {max(cps)} rows per budget; budget {few[0]} with "
            f"--seq-len {args.seq_len} has fewer (e.g. --seq-len {few[0] * 3 // 4}: a trace "
            "longer than one rank's share)",
            file=sys.stderr,
        )
        return 2
    rows: list[dict] = []
    out = (
        Path(args.json) if args.json else RESULTS / f"long_context_{args.device}_{args.model}.json"
    )
    run = {
        "command": "python -m benchmarks.micro.long_context "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "device": args.device,
        "model": args.model,
        "seq_len": args.seq_len,
        "chunk": args.chunk,
        "attn": args.attn,
        "cp": cps,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "rows": rows,
        "failed": [],
    }
    print(
        f"model {args.model} on {args.device}; rows of {args.seq_len or 'budget'} tokens; "
        f"fused chunk {args.chunk}",
        flush=True,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = config_dir(args.model, Path(tmp) / "model")
        dead: set = set()
        for budget in budgets:
            for ckpt, head, cp in itertools.product(ckpts, heads, cps):
                if (head, ckpt, cp) in dead:
                    continue
                if args.in_process:
                    row = run_point(
                        model_dir,
                        args.device,
                        budget,
                        head,
                        ckpt,
                        args.seq_len,
                        args.chunk,
                        args.updates,
                        args.attn,
                    )
                else:
                    row = _spawn_point(args, model_dir, budget, head, ckpt, cp, run["failed"])
                if row is None:
                    dead.add((head, ckpt, cp))
                    out.write_text(json.dumps(run, indent=1))
                    continue
                rows.append(row)
                print(
                    f"  {budget} ckpt={int(ckpt)} {head} cp={cp}: {row['seconds']:.2f} s, "
                    f"peak {row['peak']:.1f} {row['peak_unit']}",
                    flush=True,
                )
                out.write_text(json.dumps(run, indent=1))  # a cut-off run keeps its rows
    print(table(rows, peak_tflops))
    for f in run["failed"]:
        print(f"{f['budget']:>7} ckpt={int(f['ckpt'])} {f['head']} cp={f['cp']}: {f['why']}")
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
