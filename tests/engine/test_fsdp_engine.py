"""FSDPEngine in one process (world of one over gloo): packing, forward, training, saving."""

from __future__ import annotations

import pytest
import torch

from arealite.api.io_struct import FinetuneSpec, SaveLoadMeta
from arealite.engine.fsdp_engine import FSDPEngine
from arealite.engine.functional import gather_logprobs
from tests.support.fsdp_helpers import engine_config, random_trajectories


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    e = FSDPEngine(engine_config(tiny_model_dir), device="cpu", backend="gloo")
    e.initialize(ft_spec=FinetuneSpec(total_train_epochs=1, dataset_size=100, train_batch_size=10))
    yield e
    e.destroy()


def _reference_logprobs(model_dir, data):
    """Each sequence alone, unpadded, through the plain HF model: the slow reference."""
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    out = torch.zeros(data["input_ids"].shape)
    with torch.no_grad():
        for b in range(data["input_ids"].shape[0]):
            L = int(data["attention_mask"][b].sum())
            ids = data["input_ids"][b, :L][None]
            logits = m(input_ids=ids).logits[0]
            lp = torch.log_softmax(logits.float(), -1)
            for t in range(1, L):  # logits at t-1 predict token t
                out[b, t] = lp[t - 1, ids[0, t]]
    return out


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_forward_equals_unpacked(tiny_model_dir, attn):
    e = FSDPEngine(engine_config(tiny_model_dir, attn_impl=attn, max_tokens_per_mb=40,
                                 optimizer=None), device="cpu", backend="gloo")
    e.initialize()
    data = random_trajectories(7, seed=1)
    got = e.forward(data)
    ref = _reference_logprobs(tiny_model_dir, data)
    assert got.shape == data["input_ids"].shape
    assert float((got - ref).abs().max()) < 1e-5
    # the micro-batch budget held several sequences per pack: masking was really exercised
    assert len(e.split_micro_batches(data)) < 7
    e.destroy()


def test_forward_post_hook_temperature_and_order(engine):
    data = random_trajectories(5, seed=2)
    hook = lambda logits, mb: gather_logprobs(logits, mb["labels"], temperature=0.7)  # noqa: E731
    a = engine.forward(data, post_hook=hook)
    perm = torch.tensor([3, 0, 4, 1, 2])
    b = engine.forward({k: v[perm] for k, v in data.items()}, post_hook=hook)
    assert torch.allclose(a[perm][:, : b.shape[1]], b, atol=1e-6)
    assert torch.equal(a[:, 0], torch.zeros(5))


def _sft_loss(logits, mb):
    lp = gather_logprobs(logits, mb["labels"])
    m = mb["loss_mask"].float()
    return -(lp * m).sum() / m.sum().clamp_min(1)


def test_train_batch_reduces_loss_and_reports(engine):
    data = random_trajectories(8, seed=3)
    first = engine.train_batch(data, _sft_loss, lambda mb: mb["loss_mask"].sum())
    for _ in range(4):
        last = engine.train_batch(data, _sft_loss, lambda mb: mb["loss_mask"].sum())
    assert last["loss"] < first["loss"]
    assert first["update_successful"] == 1.0 and first["grad_norm"] > 0
    assert first["n_tokens"] == float(data["attention_mask"].sum())
    assert first["loss_weight"] == float(data["loss_mask"][:, 1:].sum())


def test_non_finite_gradient_skips_the_step(engine):
    data = random_trajectories(4, seed=4)
    before = {k: v.detach().clone() for k, v in engine.model.state_dict().items()}
    bad = lambda logits, mb: _sft_loss(logits, mb) * float("nan")  # noqa: E731
    st = engine.train_batch(data, bad, lambda mb: mb["loss_mask"].sum())
    assert st["update_successful"] == 0.0
    after = engine.model.state_dict()
    assert all(torch.equal(before[k].full_tensor() if hasattr(before[k], "full_tensor")
                           else before[k], after[k].full_tensor() if hasattr(after[k],
                           "full_tensor") else after[k]) for k in before)


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step()`")
def test_lr_schedule_warmup_then_cosine(tiny_model_dir):
    from arealite.api.config.actor import OptimizerConfig

    opt = OptimizerConfig(lr=1.0, lr_scheduler_type="cosine", warmup_steps_proportion=0.2,
                          min_lr_ratio=0.1)
    e = FSDPEngine(engine_config(tiny_model_dir, optimizer=opt), device="cpu", backend="gloo")
    e.initialize(ft_spec=FinetuneSpec(total_train_epochs=1, dataset_size=10, train_batch_size=1))
    lrs = []
    for _ in range(11):
        lrs.append(e.optimizer.param_groups[0]["lr"])
        e.step_lr_scheduler()
    assert lrs[0] == pytest.approx(1 / 3) and lrs[1] == pytest.approx(2 / 3)
    assert lrs[2] == pytest.approx(1.0)
    assert lrs[10] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(lrs[2:], lrs[3:]))
    e.destroy()


def test_hf_save_load_gives_identical_forward(engine, tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    data = random_trajectories(4, seed=5)
    engine.train_batch(data, _sft_loss, lambda mb: mb["loss_mask"].sum())  # move off the init
    before = engine.forward(data)
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    engine.save(SaveLoadMeta(path=str(tmp_path / "hf"), weight_format="hf", tokenizer=tok))
    assert (tmp_path / "hf" / "model.safetensors").exists()
    assert (tmp_path / "hf" / "tokenizer_config.json").exists()
    # transformers loads it and agrees
    ref = _reference_logprobs(tmp_path / "hf", data)
    assert float((before - ref).abs().max()) < 1e-5
    m = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"))
    assert m.config.architectures == ["Qwen2ForCausalLM"]
    # a fresh engine loading the directory computes the same values
    e2 = FSDPEngine(engine_config(tiny_model_dir, optimizer=None), device="cpu", backend="gloo")
    e2.initialize()
    assert float((e2.forward(data) - before).abs().max()) > 1e-4  # original weights differ
    e2.load(SaveLoadMeta(path=str(tmp_path / "hf"), weight_format="hf"))
    assert torch.equal(e2.forward(data), before)
    e2.destroy()


def test_param_specs_cover_the_model_in_aligned_buckets(engine):
    specs = engine.get_param_specs(bucket_size_mb=0.1)
    flat = [s for b in specs for s in b]
    names = [n for n, _ in engine.model.named_parameters()]
    assert [s.name for s in flat] == names and len(specs) > 1
    limit = int(0.1 * 1024 * 1024)
    for b in specs:
        assert len(b) == 1 or sum(s.nbytes for s in b) <= limit
    shapes = {n: tuple(p.shape) for n, p in engine.model.named_parameters()}
    assert all(shapes[s.name] == s.shape and s.dtype == "float32" for s in flat)


def test_uninitialized_engine_and_bad_config_are_clear_errors(tiny_model_dir):
    e = FSDPEngine(engine_config(tiny_model_dir), device="cpu", backend="gloo")
    with pytest.raises(RuntimeError, match="not initialized"):
        e.forward(random_trajectories(1))
    with pytest.raises(ValueError, match="nccl"):
        FSDPEngine(engine_config(tiny_model_dir), device="cpu", backend="nccl")
    with pytest.raises(ValueError, match="path"):
        FSDPEngine(engine_config(""), device="cpu").initialize()


def test_gradient_checkpointing_and_bf16_mixed_precision(tiny_model_dir):
    from arealite.api.config.actor import MixedPrecisionConfig

    data = random_trajectories(4, seed=6)
    spec = FinetuneSpec(total_train_epochs=1, dataset_size=10, train_batch_size=1)
    stats = {}
    for name, kw in {
        "plain": {},
        "ckpt": {"gradient_checkpointing": True},
        "bf16": {"mixed_precision": MixedPrecisionConfig(param_dtype="bfloat16")},
    }.items():
        e = FSDPEngine(engine_config(tiny_model_dir, **kw), device="cpu", backend="gloo")
        e.initialize(ft_spec=spec)
        stats[name] = e.train_batch(data, _sft_loss, lambda mb: mb["loss_mask"].sum())
        e.destroy()
    # recomputation changes nothing numerically; bf16 compute stays close to fp32
    assert stats["ckpt"]["loss"] == pytest.approx(stats["plain"]["loss"], abs=1e-6)
    assert stats["ckpt"]["grad_norm"] == pytest.approx(stats["plain"]["grad_norm"], rel=1e-5)
    assert stats["bf16"]["loss"] == pytest.approx(stats["plain"]["loss"], rel=2e-2)
    assert stats["bf16"]["update_successful"] == 1.0


def test_disk_upload_writes_marker_last(engine, tmp_path):
    import json

    from arealite.api.io_struct import WeightUpdateMeta

    meta = WeightUpdateMeta(type="disk", version=7, path=str(tmp_path / "w"))
    engine.upload_weights(meta)
    marker = tmp_path / "w" / "arealite_weights_ready.json"
    assert json.loads(marker.read_text()) == {"version": 7}
    weights = tmp_path / "w" / "model.safetensors"
    assert weights.stat().st_mtime_ns <= marker.stat().st_mtime_ns
    assert not (tmp_path / "w" / "arealite_weights_ready.json.tmp").exists()


def test_vision_sft_batch_trains_with_images(tiny_vl_model_dir, toy_vision_dir, tmp_path):
    """SFT rows with images: the loss falls on a fixed batch, and the images matter to it; the
    saved model directory carries the processor (it loads with ``load_processor`` and encodes a
    row as the original does)."""
    import json

    from arealite.engine.sft.lm_engine import FSDPLMEngine
    from arealite.engine.sft.vision_batch import build_vision_sft_batch
    from arealite.engine.vision_processor import load_processor

    rows = [json.loads(x) for x in (toy_vision_dir / "train.jsonl").read_text().splitlines()][:8]
    proc = load_processor(tiny_vl_model_dir)
    batch = build_vision_sft_batch(proc, [r["question"] for r in rows], [r["images"] for r in rows],
                                   [r["answer"] for r in rows])
    # 4 image tokens a row: a 32x32 scene is 2x2 merged patches
    assert batch["pixel_values"].shape[0] == 8 and batch["image_token_mask"].sum() == 8 * 4
    e = FSDPLMEngine(engine_config(tiny_vl_model_dir, max_tokens_per_mb=128), device="cpu",
                     backend="gloo")
    e.initialize(None, FinetuneSpec(total_train_epochs=1, dataset_size=80, train_batch_size=8))
    try:
        first = e.evaluate_lm(batch)
        swapped = dict(batch, pixel_values=batch["pixel_values"].roll(1, 0))
        assert e.evaluate_lm(swapped) != first  # the images reach the loss
        for _ in range(5):
            e.train_lm(batch)
        assert e.evaluate_lm(batch) < first
        e.save(SaveLoadMeta(path=str(tmp_path / "hf"), weight_format="hf", tokenizer=proc.tokenizer,
                            processor=proc))
    finally:
        e.destroy()
    saved = load_processor(tmp_path / "hf")
    again = build_vision_sft_batch(saved, [r["question"] for r in rows], [r["images"] for r in rows],
                                   [r["answer"] for r in rows])
    assert torch.equal(again["input_ids"], batch["input_ids"])
    assert torch.equal(again["pixel_values"], batch["pixel_values"])
