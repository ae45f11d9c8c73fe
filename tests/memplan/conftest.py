"""The planner runs in a process without a process group (it makes a fake one of N ranks). The
launcher and `arealite plan` always start in such a process; under pytest-xdist a worker can
still hold the default group an earlier test file left behind, so each planner test starts
without one."""

from __future__ import annotations

import pytest
import torch.distributed as dist


@pytest.fixture(autouse=True)
def no_process_group():
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    yield
