"""Differential checks against TRL's own preference losses (``trl`` as pinned in
requirements/trl.txt, installed into .venv by ``make setup``): a real
``DPOTrainer`` / ``KTOTrainer`` on the tiny model computes its loss on one collated batch
(``_compute_loss``, TRL's code as shipped, its own forward included); our ``dpo_loss`` (sigmoid,
IPO, and with ``chosen_nll``: TRL's ``["sigmoid", "sft"]``) and ``kto_loss`` on the sequence
log-probabilities of the same tensors give the same number."""

from __future__ import annotations

import pytest
import torch

from arealite.engine.functional import gather_logprobs
from arealite.engine.preference.losses import chosen_nll, dpo_loss, kto_loss, kto_reference_point

trl = pytest.importorskip("trl", reason="trl is installed by make setup")

BETA = 0.3
ROWS = [("What is 12 + 31?", "#### 43", "#### 44"), ("What is 58 - 27?", "#### 31", "#### 21"),
        ("What is 9 + 70?", "#### 79", "#### 7"), ("What is 66 - 51?", "#### 15", "#### 105")]


def _models(tiny_model_dir):
    """The reference (the tiny model) and a policy a little away from it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ref = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    pol = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in pol.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return pol, ref, AutoTokenizer.from_pretrained(str(tiny_model_dir))


def _seq_logps(model, batch, ids_key="input_ids", mask_key="attention_mask",
               comp_key="completion_mask"):
    """Summed completion log-probability of each row and its completion length, computed our
    way (arealite.engine.functional.gather_logprobs) on TRL's collated tensors."""
    skip = {"completion_mask", "ref_chosen_logps", "ref_rejected_logps", "label", "ref_logps",
            "ref_KL_logps", "KL_input_ids", "KL_attention_mask", "KL_completion_mask"}
    kw = {k: v for k, v in batch.items() if k not in skip and isinstance(v, torch.Tensor)}
    kw["input_ids"], kw["attention_mask"] = batch[ids_key], batch[mask_key]
    with torch.no_grad():
        logits = model(**kw, use_cache=False).logits[:, :-1].double()
    lp = gather_logprobs(logits, batch[ids_key][:, 1:])
    m = batch[comp_key][:, 1:].bool()
    return torch.where(m, lp, 0.0).sum(1), m.sum(1).double()


@pytest.mark.parametrize("loss_type", [["sigmoid"], ["ipo"], ["sigmoid", "sft"]])
def test_dpo_losses_equal_trls(loss_type, tiny_model_dir, tmp_path):
    from datasets import Dataset

    pol, ref, tok = _models(tiny_model_dir)
    weights = [1.0, 0.7][: len(loss_type)]
    args = trl.DPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none",
                         per_device_train_batch_size=len(ROWS), beta=BETA, loss_type=loss_type,
                         loss_weights=weights)
    data = Dataset.from_list([{"prompt": p, "chosen": c, "rejected": r} for p, c, r in ROWS])
    tr = trl.DPOTrainer(model=pol, ref_model=ref, args=args, train_dataset=data,
                        processing_class=tok)
    batch = next(iter(tr.get_train_dataloader()))
    with torch.no_grad():
        theirs = float(tr._compute_loss(tr.model, batch, False))
    lp, n = _seq_logps(pol, batch)
    rlp, _ = _seq_logps(ref, batch)
    h = len(ROWS)  # TRL's batch: all chosen rows, then all rejected rows
    main = "ipo" if "ipo" in loss_type else "sigmoid"
    losses, _, _ = dpo_loss(lp[:h], lp[h:], rlp[:h], rlp[h:], BETA, main, n[:h], n[h:])
    ours = float(losses.mean())
    if "sft" in loss_type:
        ours += weights[1] * float(chosen_nll(lp[:h], n[:h]))
    assert abs(float(losses.mean()) - 0.693) > 1e-3 or main == "ipo"  # policy != reference
    assert ours == pytest.approx(theirs, rel=2e-5, abs=1e-6)


def test_kto_loss_equals_trls(tiny_model_dir, tmp_path):
    from datasets import Dataset

    pol, ref, tok = _models(tiny_model_dir)
    rows = [{"prompt": p, "completion": c, "label": True} for p, c, _ in ROWS]
    rows += [{"prompt": p, "completion": r, "label": False} for p, _, r in ROWS]
    args = trl.KTOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none",
                         per_device_train_batch_size=len(rows), beta=BETA,
                         desirable_weight=1.5, undesirable_weight=0.8)
    tr = trl.KTOTrainer(model=pol, ref_model=ref, args=args,
                        train_dataset=Dataset.from_list(rows), processing_class=tok)
    batch = next(iter(tr.get_train_dataloader()))
    with torch.no_grad():
        theirs = float(tr._compute_loss(tr.model, batch, False))
    lp, _ = _seq_logps(pol, batch)
    rlp, _ = _seq_logps(ref, batch)
    kl = ("KL_input_ids", "KL_attention_mask", "KL_completion_mask")
    z0 = kto_reference_point(_seq_logps(pol, batch, *kl)[0], _seq_logps(ref, batch, *kl)[0])
    losses, _ = kto_loss(lp, rlp, torch.as_tensor(batch["label"]).bool(), z0, BETA, 1.5, 0.8)
    assert float(losses.mean()) == pytest.approx(theirs, rel=2e-5, abs=1e-6)
