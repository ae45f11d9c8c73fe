"""The fused LM head (arealite.engine.lm_head) against a slow loop and against the dense head:
log-probs, entropy and every gradient, alone and inside the engine (untied, tied embeddings,
LoRA, shared-prompt packing)."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from arealite.api.config.actor import LoRAConfig
from arealite.engine import functional as F
from arealite.engine.fsdp_engine import FSDPEngine
from arealite.engine.lm_head import HeadInput, fused_logprobs
from tests.support.fsdp_helpers import engine_config, random_trajectories


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max()) / max(float(b.abs().max()), 1e-12)


def _case(n=9, h=6, v=23, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    hid = torch.randn(n, h, generator=g, requires_grad=True)
    w = (torch.randn(v, h, generator=g) * 0.7).requires_grad_(True)
    b = (torch.randn(v, generator=g) * 0.3).requires_grad_(True) if bias else None
    labels = torch.randint(0, v, (n,), generator=g)
    return hid, w, b, labels


@pytest.mark.parametrize("temperature,chunk", [(1.0, 4), (0.7, 1), (1.3, 100)])
def test_fused_logprobs_and_entropy_match_a_loop(temperature, chunk):
    hid, w, b, labels = _case()
    lp, ent = fused_logprobs(hid, w, labels, temperature, chunk, b, with_entropy=True)
    hid, w, b = hid.detach(), w.detach(), b.detach()
    for i in range(hid.shape[0]):
        z = [
            (sum(float(hid[i, k]) * float(w[j, k]) for k in range(w.shape[1])) + float(b[j]))
            / temperature
            for j in range(w.shape[0])
        ]
        lse = math.log(sum(math.exp(x) for x in z))
        assert abs(float(lp[i]) - (z[int(labels[i])] - lse)) < 1e-5
        assert abs(float(ent[i]) + sum(math.exp(x - lse) * (x - lse) for x in z)) < 1e-5


@pytest.mark.parametrize("bias", [True, False])
def test_fused_gradients_equal_the_dense_head(bias):
    """Upstream gradients on both outputs; hidden, weight and bias gradients against autograd
    through the dense logits."""
    hid, w, b, labels = _case(bias=bias, seed=1)
    g = torch.Generator().manual_seed(2)
    g_lp, g_ent = torch.randn(hid.shape[0], generator=g), torch.randn(hid.shape[0], generator=g)
    lp, ent = fused_logprobs(hid, w, labels, 0.8, 2, b, with_entropy=True)
    (lp * g_lp + ent * g_ent).sum().backward()
    fused = [t.grad.clone() for t in (hid, w, b) if t is not None]
    for t in (hid, w, b):
        if t is not None:
            t.grad = None
    logits = hid @ w.t() + (b if b is not None else 0.0)
    logsm = torch.log_softmax(logits / 0.8, -1)
    ref_lp = logsm.gather(-1, labels[:, None]).squeeze(-1)
    ref_ent = -(logsm.exp() * logsm).sum(-1)
    assert _rel(lp.detach(), ref_lp.detach()) < 1e-5 and _rel(ent.detach(), ref_ent.detach()) < 1e-5
    (ref_lp * g_lp + ref_ent * g_ent).sum().backward()
    dense = [t.grad for t in (hid, w, b) if t is not None]
    for a, r in zip(fused, dense):
        assert _rel(a, r) < 1e-5


def test_head_input_dispatch_and_no_grad_paths():
    hid, w, b, labels = _case(bias=False, seed=3)
    head = HeadInput(hid, w, None, chunk_size=4)
    logits = head.logits()
    assert torch.allclose(
        F.gather_logprobs(head, labels, 0.9), F.gather_logprobs(logits, labels, 0.9), atol=1e-6
    )
    a = F.gather_logprobs_entropy(head, labels, 1.1)
    r = F.gather_logprobs_entropy(logits, labels, 1.1)
    assert all(torch.allclose(x, y, atol=1e-6) for x, y in zip(a, r))
    assert torch.equal(F.greedy_tokens(head), logits.argmax(-1))
    lp, ent = F.logprobs_and_entropy(head, labels)
    assert lp.requires_grad and not ent.requires_grad
    F.zero_loss(head).backward()
    assert float(w.grad.abs().sum()) == 0.0 and w.grad is not None
    with pytest.raises(ValueError, match="temperature"):
        F.gather_logprobs(head, labels, 0.0)


@pytest.mark.parametrize("form", ["head", "logits"])
@pytest.mark.parametrize("pattern", ["some", "none", "all"])
def test_a_mask_computes_its_rows_only_with_the_same_values_and_gradients(form, pattern):
    """``mask=``: the masked rows' logprobs and entropies equal the unmasked call's, the others
    read 0, and the gradients equal those of the unmasked outputs zeroed off the mask (what a
    masked loss back-propagates). The head's products run on the masked rows only."""
    hid, w, b, labels = _case(n=11, bias=True, seed=5)
    mask = {"some": torch.tensor([0, 1, 1, 0, 0, 1, 0, 0, 0, 1, 1], dtype=torch.bool),
            "none": torch.zeros(11, dtype=torch.bool), "all": torch.ones(11, dtype=torch.bool)}[pattern]
    g = torch.Generator().manual_seed(6)
    up = torch.randn(11, generator=g)

    def scores():
        return HeadInput(hid, w, b, chunk_size=3) if form == "head" else hid @ w.t() + b

    def grads(loss):
        for t in (hid, w, b):
            t.grad = None
        loss.backward()
        return [t.grad.clone() for t in (hid, w, b)]

    full = F.gather_logprobs(scores(), labels, 0.8)
    ref = grads((torch.where(mask, full, 0.0) * up).sum())
    part = F.gather_logprobs(scores(), labels, 0.8, mask=mask)
    assert torch.equal(part[~mask], torch.zeros(int((~mask).sum())))
    assert _rel(part[mask], full[mask].detach()) < 1e-6 if mask.any() else True
    got = grads((part * up).sum())
    for a, r in zip(got, ref):
        assert float((a - r).abs().max()) < 1e-6
    lp, ent = F.logprobs_and_entropy(scores(), labels, 0.8, mask=mask)
    lp_full, ent_full = F.logprobs_and_entropy(scores(), labels, 0.8)
    assert torch.equal(lp.detach(), part.detach()) and not ent.requires_grad
    assert float((ent - torch.where(mask, ent_full, 0.0)).abs().max()) < 1e-6
    lp2, ent2 = F.gather_logprobs_entropy(scores(), labels, 0.8, mask=mask)
    assert float((lp2 - part.detach()).abs().max()) < 1e-6 and torch.equal(ent2, ent)
    if form == "head":  # the head ran on the masked rows only
        seen = []
        h = HeadInput(hid, w, b, chunk_size=100)
        orig = F.fused_logprobs
        try:
            F.fused_logprobs = lambda hidden, *a, **k: seen.append(hidden.shape[0]) or orig(hidden, *a, **k)
            F.gather_logprobs(h, labels, mask=mask)
        finally:
            F.fused_logprobs = orig
        assert seen == [int(mask.sum())]


# ----------------------------------------------------------------------------- in the engine


def _entropy_pg_loss(out, mb):
    """A policy-gradient loss with an entropy bonus: both fused outputs carry gradient."""
    lm = mb["loss_mask"].float()
    if isinstance(out, HeadInput):
        lp, ent = fused_logprobs(
            out.hidden, out.weight, mb["labels"], 0.7, out.chunk_size, out.bias, with_entropy=True
        )
    else:
        logsm = torch.log_softmax(out.float() / 0.7, -1)
        lp = logsm.gather(-1, mb["labels"][:, None]).squeeze(-1)
        ent = -(logsm.exp() * logsm).sum(-1)
    adv = torch.linspace(-1.0, 1.0, lp.shape[0])
    return -((adv * lp + 0.1 * ent) * lm).sum() / lm.sum()


def _grads(engine: FSDPEngine, data: dict, loss_fn) -> tuple[dict, list[float]]:
    engine.model.zero_grad(set_to_none=True)
    mbl = engine.split_micro_batches(data)
    losses = []
    for mb, idx in zip(mbl.mbs, mbl.indices):
        p = engine.pack(mb, idx)
        out = engine.model_forward(p)
        assert isinstance(out, HeadInput) == (engine.config.logprob_head == "fused")
        loss = loss_fn(out, p)
        loss.backward()
        losses.append(float(loss))
    return {
        n: p.grad.clone() for n, p in engine.model.named_parameters() if p.grad is not None
    }, losses


def _tied_dir(tiny_model_dir, tmp_path):
    d = tmp_path / "tied"
    shutil.copytree(tiny_model_dir, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["tie_word_embeddings"] = True
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize("variant", ["plain", "tied", "lora", "shared_prompt"])
def test_engine_fused_head_equals_dense(tiny_model_dir, tmp_path, variant):
    kw: dict = {"max_tokens_per_mb": 48}
    path = tiny_model_dir
    if variant == "tied":
        path, kw["init_from_scratch"] = _tied_dir(tiny_model_dir, tmp_path), True
    if variant == "lora":
        kw["lora"] = LoRAConfig(
            rank=4, alpha=8.0, target_modules=["q_proj", "v_proj"], init_lora_weights=False
        )
    data = random_trajectories(6, seed=11, group_size=2 if variant == "shared_prompt" else 1)
    if variant == "shared_prompt":  # rows 2i, 2i+1 share their prompt
        data["input_ids"][1::2, :3] = data["input_ids"][0::2, :3]
    out = {}
    for head in ("dense", "fused"):
        e = FSDPEngine(
            engine_config(path, logprob_head=head, logprob_chunk_size=7, **kw),
            device="cpu",
            backend="gloo",
        )
        e.initialize()
        if variant == "shared_prompt":
            e.prefix_group_size = 2
        out[head] = _grads(e, data, _entropy_pg_loss)
        if variant == "tied":
            m = e.model
            assert m.get_output_embeddings().weight is m.get_input_embeddings().weight
        e.destroy()
    (gd, ld), (gf, lf) = out["dense"], out["fused"]
    assert max(abs(a - b) for a, b in zip(ld, lf)) < 1e-6
    assert gd.keys() == gf.keys() and len(gd) > 0
    if variant == "lora":
        assert all("lora_" in k for k in gd)
    for k in gd:
        assert _rel(gf[k], gd[k]) < 1e-5, k


def test_vision_model_fused_head_equals_dense(tiny_vl_model_dir, toy_vision_dir):
    """Rows with images through the vision-language model: same loss and gradients."""
    from arealite.engine.sft.vision_batch import build_vision_sft_batch
    from arealite.engine.vision_processor import load_processor

    rows = [json.loads(x) for x in (toy_vision_dir / "train.jsonl").read_text().splitlines()][:3]
    proc = load_processor(tiny_vl_model_dir)
    batch = build_vision_sft_batch(
        proc,
        [r["question"] for r in rows],
        [r["images"] for r in rows],
        [r["answer"] for r in rows],
    )
    out = {}
    for head in ("dense", "fused"):
        e = FSDPEngine(
            engine_config(
                tiny_vl_model_dir, logprob_head=head, logprob_chunk_size=16, max_tokens_per_mb=128
            ),
            device="cpu",
            backend="gloo",
        )
        e.initialize()
        out[head] = _grads(e, batch, _entropy_pg_loss)
        e.destroy()
    (gd, ld), (gf, lf) = out["dense"], out["fused"]
    assert max(abs(a - b) for a, b in zip(ld, lf)) < 1e-6 and gd.keys() == gf.keys()
    for k in gd:
        assert _rel(gf[k], gd[k]) < 1e-5, k
