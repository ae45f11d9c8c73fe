"""The consistency gate against a real embedded server and the FSDP trainer (fp32, CPU): near
zero when both hold the same weights at the same temperature; caught when one layer of the
server's weights is changed behind the trainer's back, or when the rollout temperature is not
the trainer's; ``action: stop`` ends the run."""

from __future__ import annotations

import pytest
import torch

from arealite.api.config.rollout import GenerationHyperparameters
from arealite.api.config.weights import ConsistencyGateConfig
from arealite.engine.fsdp_engine import FSDPEngine
from arealite.weights.consistency_gate import ConsistencyGate, ConsistencyGateError
from tests.support.fsdp_helpers import engine_config
from tests.support.procs import embedded_server
from tests.weights.test_verify_integration import corrupt

pytestmark = pytest.mark.integration

PROMPTS = [[5, 17, 42, 9], [100, 3, 77], [8, 8, 250, 31, 64]]


def gate(temperature: float = 1.0, trainer_temperature: float = 1.0, **kw) -> ConsistencyGate:
    cfg = ConsistencyGateConfig(probes=3, max_new_tokens=6, top_k=5, **kw)
    return ConsistencyGate(
        cfg,
        PROMPTS,
        GenerationHyperparameters(temperature=temperature),
        trainer_temperature,
        rank=0,
    )


def test_gate_reads_zero_then_catches_a_wrong_server(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    e = FSDPEngine(engine_config(tiny_model_dir, optimizer=None), device="cpu", backend="gloo")
    e.initialize()
    try:
        with embedded_server(str(tiny_model_dir), ["--weight-version", "0"]) as addr:
            same = gate().check(e, [addr], 0)
            fig = same.per_server[addr]
            assert not same.failed and not same.unchecked
            assert fig["positions"] == 18
            assert fig["kl_max"] < 1e-6 and fig["max_logprob_gap"] < 1e-4
            assert fig["argmax_mismatch"] == 0.0 and fig["sampled_logprob_gap"] < 1e-4

            # the rollouts sample at 0.7 while the trainer computes at 1.0 (the tiny random
            # model is nearly uniform, so the KL stays small: the log-prob gap shows it)
            hot = gate(temperature=0.7, max_logprob_gap=0.05).check(e, [addr], 0)
            assert hot.failed[addr].startswith("max_logprob_gap")
            assert hot.per_server[addr]["kl_mean"] > 1e6 * max(fig["kl_mean"], 1e-15)

            # one layer's weights differ on the server after a push
            model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
            name = "model.layers.0.mlp.down_proj.weight"
            w = dict(model.named_parameters())[name].detach()
            corrupt(
                addr,
                name,
                w + 0.5 * torch.randn(w.shape, generator=torch.Generator().manual_seed(0)),
            )
            with pytest.raises(ConsistencyGateError, match="action=stop"):
                gate(action="stop").check(e, [addr], 1)
            warned = gate().check(e, [addr], 1)
            assert warned.failed[addr] and warned.worst()["servers_failed"] == 1.0
            assert warned.per_server[addr]["kl_mean"] > 100 * max(fig["kl_mean"], 1e-6)
        # a server that does not answer is reported, not judged
        gone = gate().check(e, [addr], 1)
        assert addr in gone.unchecked and not gone.per_server and gone.worst() == {}
    finally:
        e.destroy()
