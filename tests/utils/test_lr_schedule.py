"""The lr schedule fits the run (#28): it ends at ``total_train_steps`` when that caps the run
(not at the epochs' end), and ``warmup_steps`` warms up without a known run length."""

from __future__ import annotations

import pytest
import torch

from arealite.api.io_struct import FinetuneSpec
from arealite.utils.fsdp import make_lr_scheduler


def lrs(kind: str, total: int, steps: int, **kw) -> list[float]:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = make_lr_scheduler(opt, kind, total, kw.pop("proportion", 0.0), kw.pop("min_ratio", 0.0), **kw)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_finetune_spec_steps_stop_at_the_step_cap():
    assert FinetuneSpec(2, 100, 10).total_train_steps == 20
    assert FinetuneSpec(2, 100, 10, max_train_steps=5).total_train_steps == 5
    assert FinetuneSpec(2, 100, 10, max_train_steps=50).total_train_steps == 20


def test_cosine_decays_over_the_capped_run():
    total = FinetuneSpec(100, 1000, 10, max_train_steps=10).total_train_steps
    out = lrs("cosine", total, 11)
    assert out[0] == pytest.approx(1.0) and out[10] == pytest.approx(0.0, abs=1e-9)


def test_constant_with_absolute_warmup_needs_no_run_length():
    out = lrs("constant", 1, 8, warmup_steps=3)
    assert out[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0]) and out[4:] == pytest.approx([1.0] * 4)
