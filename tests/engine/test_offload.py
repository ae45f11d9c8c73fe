"""``move_to`` on a CPU trainer moves nothing (its model is host memory already) and says so
with 0 bytes; the accelerator path is the same call with a CUDA device (untested here)."""

from __future__ import annotations

import torch

from arealite.engine.offload import move_to


def test_a_cpu_model_stays_where_it_is():
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    before = [p.data_ptr() for p in model.parameters()]
    state = {id(v): v.data_ptr() for s in opt.state.values() for v in s.values()
             if isinstance(v, torch.Tensor)}
    assert move_to(model, opt, "cpu") == 0
    assert [p.data_ptr() for p in model.parameters()] == before
    assert {id(v): v.data_ptr() for s in opt.state.values() for v in s.values()
            if isinstance(v, torch.Tensor)} == state
    assert all(p.grad is not None for p in model.parameters())  # nothing was dropped either
