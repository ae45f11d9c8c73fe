"""LoRA on the FSDP2 engine (world of one over gloo): only the adapter trains, its logprobs
equal peft's own model, and checkpoints / pushes carry the adapter alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from arealite.api.config.actor import LoRAConfig
from arealite.api.io_struct import FinetuneSpec, SaveLoadMeta, WeightUpdateMeta
from arealite.engine import lora
from arealite.engine.fsdp_engine import FSDPEngine
from arealite.engine.functional import gather_logprobs
from tests.support.fsdp_helpers import engine_config, random_trajectories

LORA = LoRAConfig(rank=4, alpha=8.0, target_modules=["q_proj", "v_proj", "down_proj"])


def lora_engine(model_dir, cfg: LoRAConfig = LORA, **kw) -> FSDPEngine:
    e = FSDPEngine(engine_config(model_dir, lora=cfg, **kw), device="cpu", backend="gloo")
    e.initialize(ft_spec=FinetuneSpec(total_train_epochs=1, dataset_size=100, train_batch_size=10))
    return e


def _sft_loss(logits, mb):
    lp = gather_logprobs(logits, mb["labels"])
    m = mb["loss_mask"].float()
    return -(lp * m).sum() / m.sum().clamp_min(1)


def _weight(mb):
    return mb["loss_mask"].sum()


def peft_logprobs(base_dir, adapter_dir, data) -> torch.Tensor:
    """Each row alone through peft's own model loaded from the saved adapter: the reference."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    m = PeftModel.from_pretrained(base, str(adapter_dir)).eval()
    out = torch.zeros(data["input_ids"].shape)
    with torch.no_grad():
        for b in range(data["input_ids"].shape[0]):
            n = int(data["attention_mask"][b].sum())
            ids = data["input_ids"][b, :n][None]
            lp = torch.log_softmax(m(input_ids=ids).logits[0].float(), -1)
            out[b, 1:n] = lp[:-1].gather(1, ids[0, 1:, None])[:, 0]
    return out


def test_only_adapter_trains_and_saved_adapter_matches_peft(tiny_model_dir, tmp_path):
    e = lora_engine(tiny_model_dir)
    base_before = {n: p.detach().clone() for n, p in e.model.named_parameters()
                   if not p.requires_grad}
    trainable = lora.adapter_param_names(e.model)
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    # optimizer state only for the adapter
    opt_params = [p for g in e.optimizer.param_groups for p in g["params"]]
    assert len(opt_params) == len(trainable)
    data = random_trajectories(8, seed=3)
    at_start = e.forward(data)
    first = e.train_batch(data, _sft_loss, _weight)
    for _ in range(3):
        last = e.train_batch(data, _sft_loss, _weight)
    assert last["loss"] < first["loss"] and first["grad_norm"] > 0
    for n, p in e.model.named_parameters():
        if n in base_before:
            assert torch.equal(p.detach(), base_before[n]), f"frozen {n} moved"
    # B starts at zero (peft's init): the adapted model began equal to the base model
    from tests.engine.test_fsdp_engine import _reference_logprobs
    ref = _reference_logprobs(tiny_model_dir, data)
    assert float((at_start - ref).abs().max()) < 1e-5
    # the saved adapter is peft's format and peft's model gives the engine's logprobs
    out = tmp_path / "adapter"
    e.save(SaveLoadMeta(path=str(out), weight_format="hf", with_optim=False))
    cfg = json.loads((out / lora.ADAPTER_CONFIG).read_text())
    assert cfg["r"] == 4 and cfg["lora_alpha"] == 8.0
    assert set(cfg["target_modules"]) == {"q_proj", "v_proj", "down_proj"}
    got = e.forward(data)
    want = peft_logprobs(tiny_model_dir, out, data)
    assert float((got - want).abs().max()) < 1e-5
    assert float((got - ref).abs().max()) > 1e-3  # training changed the adapted model
    # a second engine loads the adapter back and gives the same logprobs
    e2 = lora_engine(tiny_model_dir)
    e2.load(SaveLoadMeta(path=str(out), weight_format="hf", with_optim=False))
    assert float((e2.forward(data) - got).abs().max()) < 1e-6
    e2.destroy()
    # the weight push writes the adapter alone (a few KB), then the ready marker
    push = tmp_path / "push"
    meta = WeightUpdateMeta(type="disk", path=str(push), version=1)
    e.upload_weights(meta)
    assert meta.read_disk_marker() == 1
    assert (push / lora.ADAPTER_WEIGHTS).is_file() and not list(push.glob("model*.safetensors"))
    e.destroy()


def test_dcp_checkpoint_resumes_adapter_and_optimizer(tiny_model_dir, tmp_path):
    e = lora_engine(tiny_model_dir)
    data = random_trajectories(6, seed=5)
    e.train_batch(data, _sft_loss, _weight)
    e.save(SaveLoadMeta(path=str(tmp_path / "ck"), weight_format="dcp", with_optim=True))
    # the checkpoint holds the adapter and its optimizer state, never the frozen base
    from torch.distributed.checkpoint import FileSystemReader

    keys = list(FileSystemReader(str(tmp_path / "ck")).read_metadata().state_dict_metadata)
    model_keys = [k for k in keys if k.startswith("model.")]
    assert model_keys and all(lora.is_adapter_param(k) for k in model_keys), model_keys[:3]
    assert any(k.startswith("optim.state.") and ".lora_" in k for k in keys)
    assert not any(k.startswith("optim.state.") and ".lora_" not in k for k in keys)
    ck_bytes = sum(f.stat().st_size for f in (tmp_path / "ck").rglob("*") if f.is_file())
    base_bytes = sum(f.stat().st_size for f in Path(tiny_model_dir).glob("*.safetensors"))
    assert ck_bytes < base_bytes / 2, (ck_bytes, base_bytes)
    e.train_batch(data, _sft_loss, _weight)
    after_two = e.forward(data)
    e2 = lora_engine(tiny_model_dir)
    e2.load(SaveLoadMeta(path=str(tmp_path / "ck"), weight_format="dcp", with_optim=True))
    e2.train_batch(data, _sft_loss, _weight)
    assert float((e2.forward(data) - after_two).abs().max()) < 1e-6
    e.destroy()
    e2.destroy()


def test_bad_adapter_folder_and_target_modules(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="lm_head"):
        LoRAConfig(target_modules=["lm_head"])
    with pytest.raises(ValueError, match="nope_proj"):
        lora_engine(tiny_model_dir, LoRAConfig(target_modules=["nope_proj"]))
    e = lora_engine(tiny_model_dir)
    with pytest.raises(ValueError, match="not a LoRA adapter folder"):
        e.load(SaveLoadMeta(path=str(tmp_path), weight_format="hf", with_optim=False))
    e.destroy()


def test_a_lora_grpo_run_must_push_through_disk_or_memory():
    from arealite.api.config.experiment import GRPOConfig

    with pytest.raises(ValueError, match="weight_update.type=disk"):
        GRPOConfig.model_validate({"actor": {"lora": {"rank": 4}},
                                   "weight_update": {"type": "distributed"}})
    for how in ("disk", "tensor"):  # tensor: in memory (/load_lora_adapter_from_tensors)
        cfg = GRPOConfig.model_validate({"actor": {"lora": {"rank": 4}},
                                         "weight_update": {"type": how}})
        assert cfg.actor.lora.rank == 4


def test_wrapping_prints_no_warning(tiny_model_dir):
    # a LoRA trainer's log shows what the run did, not peft's use of a deprecated transformers alias
    import warnings

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wrapped = lora.wrap_with_lora(model, LORA)
    assert lora.is_lora_model(wrapped)
