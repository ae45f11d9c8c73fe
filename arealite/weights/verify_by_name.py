"""Checking the servers' weights against the trainer's via ``/get_weights_by_name``
(ARCHITECTURE invariant 5). The endpoint returns ``param.float().tolist()[:truncate_size]``:
a flat list for 1-D parameters, the first ``truncate_size`` rows of 2-D ones."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import torch

from arealite.utils.http import call_json


async def fetch_weights(
    session: aiohttp.ClientSession, addrs: list[str], name: str, truncate_size: int,
    timeout: float, headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """``{addr: values}`` of parameter ``name`` on every server, fetched at once (an admin
    endpoint: ``headers`` carry the admin key)."""
    res = await asyncio.gather(*(
        call_json(session, "POST", f"http://{a}/get_weights_by_name",
                  {"name": name, "truncate_size": truncate_size}, timeout, headers=headers)
        for a in addrs
    ))
    return {a: r.body for a, r in zip(addrs, res)}


def weight_mismatches(
    name: str, expected: torch.Tensor, fetched: dict[str, Any], truncate_size: int, atol: float
) -> list[str]:
    """One line per server whose values of ``name`` differ from ``expected``."""
    want = expected.detach().float().cpu()[:truncate_size]
    bad = []
    for addr, got in fetched.items():
        g = torch.tensor(got, dtype=torch.float32)
        if g.shape != want.shape:
            bad.append(f"{addr} {name}: shape {tuple(g.shape)} != {tuple(want.shape)}")
        elif not torch.allclose(g, want, atol=atol, rtol=0):
            bad.append(f"{addr} {name}: max diff {(g - want).abs().max().item():.3g}")
    return bad
