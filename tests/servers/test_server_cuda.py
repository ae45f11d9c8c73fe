"""The embedded server on a CUDA device in bf16 (``pytest -m cuda``; skipped without one): its
log-probs against transformers' on the same tokens, a push of CUDA tensors by IPC handle
(``/update_weights_from_tensor``) verified by checksum, release and resume of its memory
(``/release_memory_occupation``) measured on the device, and the consistency gate against the
FSDP trainer on the same GPU. Run by ``benchmarks/gpu_check`` on a lent GPU."""

from __future__ import annotations

import json
import urllib.request

import pytest
import torch

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.integration,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

PROMPTS = [[5, 17, 42, 9, 11, 3], [100, 3, 77], [8, 8, 250, 31, 64, 2, 19]]


def _post(addr: str, path: str, body: dict | None = None) -> object:
    req = urllib.request.Request(
        f"http://{addr}{path}",
        data=json.dumps(body or {}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read() or b"null")


def _free_bytes() -> int:
    torch.cuda.synchronize()
    return int(torch.cuda.mem_get_info()[0])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A ~25M-parameter Qwen2 (untied) from a config: weights that dwarf allocator rounding."""
    from arealite.demo.tiny import TinyModelSpec, build_tiny_model

    spec = TinyModelSpec(
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
    )
    return build_tiny_model(tmp_path_factory.mktemp("cuda_model"), spec)


@pytest.fixture(scope="module")
def server(model_dir):
    from tests.support.procs import embedded_server

    with embedded_server(
        str(model_dir),
        ["--device", "cuda", "--dtype", "bfloat16", "--weight-version", "0"],
        timeout=300,
    ) as addr:
        yield addr


def _generate(addr: str, new: int = 24) -> list[dict]:
    return _post(
        addr,
        "/generate",
        {
            "input_ids": PROMPTS,
            "return_logprob": True,
            "sampling_params": {"max_new_tokens": new, "temperature": 0.0, "ignore_eos": True},
        },
    )


def test_bf16_logprobs_match_transformers_on_the_same_tokens(server, model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda().eval()
    worst = 0.0
    for prompt, out in zip(PROMPTS, _generate(server)):
        ids = out["output_ids"]
        served = torch.tensor([e[0] for e in out["meta_info"]["output_token_logprobs"]])
        with torch.no_grad():
            logits = model(torch.tensor([prompt + ids], device="cuda")).logits[0].float()
        ref = (
            torch.log_softmax(logits, -1)[len(prompt) - 1 : -1]
            .gather(-1, torch.tensor(ids, device="cuda").view(-1, 1))
            .view(-1)
            .cpu()
        )
        worst = max(worst, float((served - ref).abs().max()))
    print(f"bf16 server vs transformers: max |dlogp| {worst:.4f}")
    assert worst < 0.15  # bf16 batched decode vs one full forward: rounding, not a bug


def test_cuda_ipc_push_lands_exactly(server, model_dir):
    from transformers import AutoModelForCausalLM

    from arealite.weights.shared_tensors import serialize_named_tensors
    from arealite.weights.verify import tensor_checksum

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda()
    g = torch.Generator(device="cuda").manual_seed(0)
    named = [
        (
            n,
            (
                p.detach() + 0.01 * torch.randn(p.shape, device="cuda", generator=g, dtype=p.dtype)
            ).contiguous(),
        )
        for n, p in model.named_parameters()
    ]
    assert all(t.is_cuda for _, t in named)
    res = _post(
        server,
        "/update_weights_from_tensor",
        {"serialized_named_tensors": [serialize_named_tensors(named)], "weight_version": "1"},
    )
    assert res["success"], res
    torch.cuda.synchronize()
    sums = _post(server, "/weights_checker", {"action": "checksum"})["ranks"][0]["checksums"]
    assert sums == {n: tensor_checksum(t) for n, t in named}


def test_release_frees_the_weights_and_resume_restores_them(server, model_dir):
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(model_dir)
    weight_bytes = 2 * sum(p.numel() for p in _param_shapes(cfg))
    before = _generate(server, 16)
    held = _free_bytes()
    _post(server, "/pause_generation", {"mode": "abort"})
    _post(server, "/release_memory_occupation", {"tags": ["weights", "kv_cache"]})
    released = _free_bytes()
    _post(server, "/resume_memory_occupation", {"tags": ["weights", "kv_cache"]})
    _post(server, "/continue_generation")
    resumed = _free_bytes()
    freed, taken = released - held, released - resumed
    print(
        f"weights {weight_bytes / 2**20:.1f} MiB; release freed {freed / 2**20:.1f} MiB, "
        f"resume took {taken / 2**20:.1f} MiB"
    )
    assert freed >= 0.9 * weight_bytes
    assert taken >= 0.9 * weight_bytes
    assert [o["output_ids"] for o in _generate(server, 16)] == [o["output_ids"] for o in before]


def _param_shapes(cfg):
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return list(AutoModelForCausalLM.from_config(cfg).parameters())


def test_consistency_gate_bf16_server_against_the_fsdp_trainer(server, model_dir):
    from transformers import AutoModelForCausalLM

    from arealite.api.config.actor import MixedPrecisionConfig
    from arealite.api.config.rollout import GenerationHyperparameters
    from arealite.api.config.weights import ConsistencyGateConfig
    from arealite.engine.fsdp_engine import FSDPEngine
    from arealite.weights.consistency_gate import ConsistencyGate
    from arealite.weights.shared_tensors import serialize_named_tensors
    from tests.support.fsdp_helpers import engine_config

    # the server may hold the perturbed weights of the push test: push the originals back
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda()
    named = [(n, p.detach().contiguous()) for n, p in model.named_parameters()]
    assert _post(
        server,
        "/update_weights_from_tensor",
        {"serialized_named_tensors": [serialize_named_tensors(named)], "weight_version": "2"},
    )["success"]
    torch.cuda.synchronize()
    e = FSDPEngine(
        engine_config(
            model_dir, optimizer=None, mixed_precision=MixedPrecisionConfig(param_dtype="bfloat16")
        ),
        device="cuda",
        backend="nccl",
    )
    e.initialize()
    try:
        cfg = ConsistencyGateConfig(probes=3, max_new_tokens=16, top_k=8)
        gate = ConsistencyGate(cfg, PROMPTS, GenerationHyperparameters(temperature=1.0), 1.0, 0)
        fig = gate.check(e, [server], 2).per_server[server]
    finally:
        e.destroy()
    print(f"bf16 gate: {fig}")
    assert fig["kl_mean"] < 1e-2 and fig["positions"] == 48
