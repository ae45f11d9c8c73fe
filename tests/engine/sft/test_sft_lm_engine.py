"""SFT on the toy task: the completion mask is right and the held-out loss falls."""

from __future__ import annotations

import pytest
import torch

from arealite.api.config.actor import OptimizerConfig
from arealite.api.io_struct import FinetuneSpec
from arealite.demo.toy_math import generate_toy_math
from arealite.engine.functional import greedy_tokens
from arealite.engine.sft.lm_engine import FSDPLMEngine, build_sft_batch
from tests.support.fsdp_helpers import engine_config


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def test_sft_batch_masks_exactly_the_completion(tokenizer):
    b = build_sft_batch(tokenizer, ["What is 1 + 2?"], ["1 + 2 = 3\n#### 3"])
    ids, lm = b["input_ids"][0], b["loss_mask"][0]
    text_prompt = tokenizer.decode(ids[~lm])
    text_completion = tokenizer.decode(ids[lm])
    assert text_prompt.endswith("<|im_start|>assistant\n") and "What is 1 + 2?" in text_prompt
    assert text_completion == "1 + 2 = 3\n#### 3<|im_end|>"
    assert int(ids[lm][-1]) == tokenizer.eos_token_id
    with pytest.raises(ValueError, match="completions"):
        build_sft_batch(tokenizer, ["a"], [])


def test_sft_warm_start_lowers_heldout_loss(tiny_model_dir, tokenizer):
    train = generate_toy_math(64, seed=0, split="train")
    valid = generate_toy_math(16, seed=0, split="valid")
    opt = OptimizerConfig(lr=3e-3, lr_scheduler_type="cosine", warmup_steps_proportion=0.1)
    eng = FSDPLMEngine(engine_config(tiny_model_dir, optimizer=opt, max_tokens_per_mb=512),
                       device="cpu", backend="gloo")
    steps = 24
    eng.initialize(ft_spec=FinetuneSpec(total_train_epochs=1, dataset_size=16 * steps,
                                        train_batch_size=16))
    vb = build_sft_batch(tokenizer, [r["question"] for r in valid], [r["answer"] for r in valid])
    before = eng.evaluate_lm(vb)
    for s in range(steps):
        rows = [train[(s * 16 + i) % len(train)] for i in range(16)]
        st = eng.train_lm(build_sft_batch(tokenizer, [r["question"] for r in rows],
                                          [r["answer"] for r in rows]))
        assert st["update_successful"] == 1.0
    after = eng.evaluate_lm(vb)
    print(f"sft held-out nll {before:.3f} -> {after:.3f}")
    assert before > 5.0 and after < 0.6 * before, (before, after)
    assert torch.isfinite(torch.tensor(after))
    # held-out NLL and exact match from one forward (what the SFT script logs) = evaluate_lm and a
    # row-by-row check of a separate greedy forward
    loss, exact = eng.evaluate_lm_exact(vb)
    greedy = eng.forward(vb, post_hook=lambda logits, mb: greedy_tokens(logits).float())
    ids, mask = vb["input_ids"], vb["loss_mask"].bool()
    rows_ok = [all(int(greedy[b, t]) == int(ids[b, t]) for t in range(ids.shape[1]) if mask[b, t])
               for b in range(len(ids))]
    assert 0 < sum(rows_ok) < len(rows_ok), rows_ok  # both outcomes occur: the share is checked
    assert loss == after and exact == sum(rows_ok) / len(rows_ok), (loss, after, exact, rows_ok)
    eng.destroy()
