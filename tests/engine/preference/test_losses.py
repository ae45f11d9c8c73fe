"""DPO, IPO and KTO losses against loops from the papers' formulas, and DPO/IPO against AReaL's
own ``dpo_preference_loss`` (its functional.py loaded alone, as in test_areal_parity)."""

from __future__ import annotations

import math

import pytest
import torch

from arealite.engine.preference import losses as L
from tests.engine.ppo.test_areal_parity import areal  # noqa: F401 (fixture)
from tests.support.random_batch import TOL


def _rand(seed: int, n: int = 9):
    g = torch.Generator().manual_seed(seed)
    lp = [-(torch.rand(n, generator=g, dtype=torch.float64) * 20) for _ in range(4)]
    lens = [torch.randint(1, 30, (n,), generator=g).double() for _ in range(2)]
    return lp, lens


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def _log_sigmoid(x: float) -> float:
    return -math.log1p(math.exp(-x)) if x > 0 else x - math.log1p(math.exp(x))


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_dpo_matches_loop(loss_type):
    (pc, pr, rc, rr), (nc, nr) = _rand(1)
    beta = 0.3
    losses, rew_c, rew_r = L.dpo_loss(pc, pr, rc, rr, beta, loss_type, nc, nr)
    for i in range(len(pc)):
        a, b = float(pc[i] - rc[i]), float(pr[i] - rr[i])
        if loss_type == "sigmoid":  # -log σ(β((π_c - ref_c) - (π_r - ref_r)))
            want = -_log_sigmoid(beta * (a - b))
        else:  # (length-averaged log-ratio difference - 1/(2β))^2
            want = (a / float(nc[i]) - b / float(nr[i]) - 1 / (2 * beta)) ** 2
        assert abs(float(losses[i]) - want) < TOL
        assert abs(float(rew_c[i]) - beta * a) < TOL and abs(float(rew_r[i]) - beta * b) < TOL


def test_kto_matches_loop():
    (p, r, _, _), _ = _rand(2)
    good = torch.arange(len(p)) % 3 != 0
    beta, z0, wd, wu = 0.2, 0.7, 1.0, 1.33
    losses, _ = L.kto_loss(p, r, good, z0, beta, wd, wu)
    for i in range(len(p)):
        x = float(p[i] - r[i])
        want = wd * (1 - _sigmoid(beta * (x - z0))) if good[i] else \
            wu * (1 - _sigmoid(beta * (z0 - x)))
        assert abs(float(losses[i]) - want) < TOL


def test_kto_reference_point_is_a_clamped_mean():
    assert L.kto_reference_point(torch.tensor([1.0, 2.0]), torch.tensor([0.0, 0.0])) == 1.5
    assert L.kto_reference_point(torch.tensor([-1.0]), torch.tensor([0.0])) == 0.0


def test_unknown_dpo_loss_type_is_an_error():
    with pytest.raises(ValueError, match="sigmoid or ipo"):
        L.dpo_loss(*[torch.zeros(1)] * 4, 0.1, "hinge")


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_dpo_equals_areal(areal, loss_type):  # noqa: F811
    (pc, pr, rc, rr), (nc, nr) = _rand(3)
    beta = 0.1
    got, _, _ = L.dpo_loss(pc, pr, rc, rr, beta, loss_type, nc, nr)
    if loss_type == "sigmoid":
        logits = (pc - rc) - (pr - rr)
    else:  # AReaL expects the per-token averaged logits for IPO
        logits = (pc - rc) / nc - (pr - rr) / nr
    want = areal.dpo_preference_loss(logits, beta=beta, loss_type=loss_type)
    assert torch.allclose(got.float(), want, rtol=1e-6, atol=1e-6)


def test_kto_reference_point_is_one_mean_over_all_ranks(tmp_path):
    """Two gloo ranks with different rows (one negative mean log-ratio, one positive) share
    one z0: the mean over both ranks' rows, clamped at 0 (as TRL gathers it)."""
    import json
    from pathlib import Path

    from tests.support.kto_z0_peer import rows
    from tests.support.procs import run_gloo_peers

    outs = run_gloo_peers(Path(__file__).resolve().parents[2] / "support" / "kto_z0_peer.py", tmp_path)
    z = [json.loads(o.read_text()) for o in outs]
    (a, ra), (b, rb) = rows(0), rows(1)
    pooled = torch.cat([a - ra, b - rb])
    assert z[0] == z[1] == pytest.approx(max(float(pooled.mean()), 0.0), abs=1e-12)
    assert L.kto_reference_point(a, ra) == 0.0 < z[0]  # rank 0 alone would clamp to 0
