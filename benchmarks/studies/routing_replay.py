"""The train-inference log-prob gap of a mixture-of-experts model, with and without routing replay.

    python -m benchmarks.studies.routing_replay [--prompts 16] [--new-tokens 16] [--server-dtype bfloat16]

The mismatch real systems have: the server runs the model in bf16, the trainer in fp32. For the
dense tiny model (Qwen2) and its MoE twin (Qwen3-MoE, 4 experts, top-2, same sizes) built from
one seed, the embedded engine (in-process, continuous batching, KV cache) samples completions
with ``return_routed_experts``; its answers go through the wire format (``build_output`` ->
the client's ``parse_generate_response`` -> the parts joined -> trajectory rows), and the FSDP
trainer (fp32, ``routing_replay``) recomputes the log-prob of every sampled token. Figures:
mean and max |server - trainer| per sampled token for dense, MoE without replay (the routers
pick freely) and MoE with replay, the ratios, and the routing agreement (share of token-layers
whose trainer top-k set equals the server's). Results: ``benchmarks/results/routing_replay/``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
from pathlib import Path
from typing import Any

import torch


def _perturb_routers(runner: Any, noise: float, seed: int) -> None:
    """Add ``noise`` x (each router's weight std) Gaussian noise to the server's routers."""
    from servers.engine.routed_experts import moe_routers

    gen = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for r in moe_routers(runner.decoder).values():
            r.weight += (
                noise * r.weight.std() * torch.randn(r.weight.shape, generator=gen).to(r.weight)
            )


def _sample(
    model: Path,
    server_dtype: str,
    prompts: list[list[int]],
    new_tokens: int,
    moe: bool,
    seed: int,
    router_noise: float = 0.0,
) -> list[dict[str, Any]]:
    """Trajectory rows of the engine's samples, as the client builds them from the answers."""
    from arealite.api.trajectory import ROUTED_EXPERTS, routed_experts_row
    from arealite.backends.sglang import parse_generate_response
    from arealite.rollout.routed_experts import check_complete, join_segment
    from servers.engine.engine import Engine
    from servers.engine.model_runner import ModelRunner
    from servers.engine.routed_experts import SequenceRouting
    from servers.engine.sequence import Sequence
    from servers.protocol.request import SamplingParams
    from servers.protocol.responses import Detokenizer, build_output

    runner = ModelRunner(str(model), dtype=server_dtype)
    if moe:
        runner.enable_routed_experts()
        if router_noise:
            _perturb_routers(runner, router_noise, seed)
    engine = Engine(runner, weight_version="0", random_seed=seed)
    engine.start()
    try:
        seqs, events = [], []
        for i, p in enumerate(prompts):
            routing = (
                SequenceRouting(runner.num_hidden_layers, runner.routed.top_k) if moe else None
            )
            s = Sequence(
                rid=f"r{i}",
                prompt=list(p),
                return_logprob=True,
                routing=routing,
                params=SamplingParams(max_new_tokens=new_tokens, ignore_eos=True),
            )
            ev = threading.Event()
            s.on_event = lambda _s, _n, final, ev=ev: ev.set() if final else None
            seqs.append(s)
            events.append(ev)
            engine.submit(s)
        for ev in events:
            if not ev.wait(300):
                raise TimeoutError("the engine did not finish its samples in 300 s")
        detok = Detokenizer(runner.tokenizer)
        rows = []
        for s in seqs:
            seg = parse_generate_response(build_output(s, len(s.output_ids), True, detok, "0"), 0)
            n_in, n_out = len(s.prompt), len(seg.output_ids)
            row = {
                "input_ids": s.prompt + seg.output_ids,
                "loss_mask": [0] * n_in + [1] * n_out,
                "logprobs": [0.0] * n_in + seg.logprobs,
            }
            if moe:
                routed = check_complete(join_segment(None, seg, n_in, None), n_in + n_out, s.rid)
                row[ROUTED_EXPERTS] = routed_experts_row(routed, n_in + n_out)
            rows.append(row)
        return rows
    finally:
        engine.shutdown()


def _trainer_logp(model: Path, batch: dict[str, torch.Tensor], replay: bool) -> tuple[Any, Any]:
    """fp32 trainer log-probs of ``batch`` and the replay engine (None for a dense model)."""
    from arealite.api.config.actor import TrainEngineConfig
    from arealite.engine.fsdp_engine import FSDPEngine

    cfg = TrainEngineConfig(
        path=str(model),
        optimizer=None,
        dtype="float32",
        routing_replay=replay,
        max_tokens_per_mb=4096,
    )
    eng = FSDPEngine(cfg, device="cpu", backend="gloo")
    eng.initialize()
    return eng, eng.forward(batch)


def _gap(logp: torch.Tensor, batch: dict[str, torch.Tensor]) -> dict[str, float]:
    mask = batch["loss_mask"].bool()
    d = (logp - batch["logprobs"]).abs()[mask]
    return {"mean": float(d.mean()), "max": float(d.max()), "tokens": int(mask.sum())}


def toy_prompts(tokenizer_dir: Path, n: int, seed: int) -> list[list[int]]:
    """``n`` toy-task questions as chat prompts (token ids)."""
    from transformers import AutoTokenizer

    from arealite.demo.toy_math import generate_toy_math

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    texts = [
        tok.apply_chat_template(
            [{"role": "user", "content": r["question"]}], add_generation_prompt=True, tokenize=False
        )
        for r in generate_toy_math(n=n, seed=seed + 1)
    ]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def gap_figures(
    dense: Path | None,
    moe: Path,
    prompts: list[list[int]],
    new_tokens: int,
    server_dtype: str = "bfloat16",
    router_noise: float = 0.0,
    seed: int = 0,
) -> dict[str, Any]:
    """Sample from both models on the engine, recompute on the fp32 trainer; the figures
    (``dense`` skipped when None)."""
    from arealite.api.trajectory import ROUTED_EXPERTS, pad_sequences_to_tensors

    out: dict[str, Any] = {
        "server_dtype": server_dtype,
        "trainer_dtype": "float32",
        "router_noise": router_noise,
        "prompts": len(prompts),
        "new_tokens": new_tokens,
    }
    if dense is not None:
        d_batch = pad_sequences_to_tensors(
            _sample(dense, server_dtype, prompts, new_tokens, False, seed)
        )
        _, d_logp = _trainer_logp(dense, d_batch, replay=False)
        out["dense"] = _gap(d_logp, d_batch)
    m_batch = pad_sequences_to_tensors(
        _sample(moe, server_dtype, prompts, new_tokens, True, seed, router_noise)
    )
    eng, with_replay = _trainer_logp(moe, m_batch, replay=True)
    stats = eng.routing.take_stats()
    without = eng.forward({k: v for k, v in m_batch.items() if k != ROUTED_EXPERTS})
    out["moe_replay"] = _gap(with_replay, m_batch)
    out["moe_no_replay"] = _gap(without, m_batch)
    out["routing_agreement"] = stats.get("moe/agreement")
    out["max_load"] = {k: v for k, v in stats.items() if "max_load" in k}
    out["no_replay_over_replay"] = out["moe_no_replay"]["mean"] / out["moe_replay"]["mean"]
    if dense is not None:
        out["no_replay_over_dense"] = out["moe_no_replay"]["mean"] / out["dense"]["mean"]
        out["replay_over_dense"] = out["moe_replay"]["mean"] / out["dense"]["mean"]
    return out


def measure(
    root: Path,
    n_prompts: int = 16,
    new_tokens: int = 16,
    server_dtype: str = "bfloat16",
    seed: int = 0,
    init: float = 0.02,
    router_noise: float = 0.0,
    num_experts: int = 4,
) -> dict[str, Any]:
    """Build both tiny models under ``root`` (one seed, one init), then ``gap_figures``."""
    from arealite.demo.tiny import TinyModelSpec, build_tiny_model

    dense = build_tiny_model(root / "dense", TinyModelSpec(seed=seed, initializer_range=init))
    moe = build_tiny_model(
        root / "moe",
        TinyModelSpec(seed=seed, moe=True, initializer_range=init, num_experts=num_experts),
    )
    res = gap_figures(
        dense,
        moe,
        toy_prompts(dense, n_prompts, seed),
        new_tokens,
        server_dtype,
        router_noise,
        seed,
    )
    return {"init": init, "num_experts": num_experts, **res}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--server-dtype", default="bfloat16")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--init", type=float, default=0.02, help="initializer_range of both models")
    p.add_argument(
        "--router-noise",
        type=float,
        default=0.0,
        help="perturb the server's routers by this x their weight std (a mismatch "
        "of the routers alone; use with --server-dtype float32)",
    )
    p.add_argument("--experts", type=int, default=4)
    p.add_argument("--out", default="benchmarks/results/routing_replay")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        res = measure(
            Path(tmp),
            a.prompts,
            a.new_tokens,
            a.server_dtype,
            a.seed,
            a.init,
            a.router_noise,
            a.experts,
        )
    print(json.dumps(res, indent=2))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (
        out
        / f"gap_{a.server_dtype}_noise{a.router_noise}_e{a.experts}_init{a.init}_seed{a.seed}.json"
    ).write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
