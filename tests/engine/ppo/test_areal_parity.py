"""Differential checks against AReaL's own functions (the ``areal`` wheel that ``make
setup-areal`` installs into ``.venv-areal``): GSPO, the behaviour corrections (AReaL's rejection
sampling: mask / clamp, token / sequence, two-sided) and DAPO's overlong penalty give the same
numbers on the same inputs. AReaL's ``functional.py`` is loaded as a single file, with its two
package imports stubbed, so neither its package tree nor its dependencies are imported."""

from __future__ import annotations

import importlib.util
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from arealite.engine.ppo import corrections as C
from arealite.engine.ppo import estimators as E
from arealite.engine.ppo import policy_losses as P

REPO = Path(__file__).resolve().parents[3]
FILES = sorted(REPO.glob(".venv-areal/lib/python*/site-packages/areal/utils/functional/"
                         "functional.py"))


@dataclass
class RejectionSampling:  # the fields AReaL's RejectionSamplingConfig has
    level: str = "token"
    action: str = "mask"
    metric: str = "ratio"
    agg: str = "mean"
    upper: float = 2.0
    lower: float | None = None


@pytest.fixture(scope="module")
def areal():
    if not FILES:
        pytest.skip("no .venv-areal with the areal wheel (make setup-areal)")
    stubs = {"areal": types.ModuleType("areal"), "areal.api": types.ModuleType("areal.api"),
             "areal.api.cli_args": types.ModuleType("areal.api.cli_args"),
             "areal.utils": types.ModuleType("areal.utils"),
             "areal.utils.data": types.ModuleType("areal.utils.data")}
    stubs["areal.api.cli_args"].RejectionSamplingConfig = RejectionSampling
    stubs["areal.utils.data"].KLEstimator = None  # only the kl_* metrics use it
    saved = {k: sys.modules.get(k) for k in stubs}
    sys.modules.update(stubs)
    try:
        spec = importlib.util.spec_from_file_location("areal_functional", FILES[0])
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return mod


def _packed(seed: int):
    g = torch.Generator().manual_seed(seed)
    lens = torch.tensor([6, 2, 9, 4, 7])
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(lens, 0)
    seq_ids, n = P.packed_seq_ids(cu)
    T = int(cu[-1])
    behave = -torch.rand(T, generator=g, dtype=torch.float64) * 2
    prox = behave + 0.2 * torch.randn(T, generator=g, dtype=torch.float64)
    lp = prox + 0.1 * torch.randn(T, generator=g, dtype=torch.float64)
    lm = torch.rand(T, generator=g) > 0.2
    lm[seq_ids == 1] = False
    adv = torch.randn(n, generator=g, dtype=torch.float64)[seq_ids]  # one per sample (GRPO)
    return lp, prox, behave, adv, lm, seq_ids, n, cu


def test_gspo_equals_areal_sequence_level_ppo(areal):
    lp, prox, _, adv, lm, seq_ids, n, cu = _packed(1)
    a, b = lp.clone().requires_grad_(True), lp.clone().requires_grad_(True)
    want, _ = areal.ppo_actor_loss_fn(a, prox, prox, adv, 0.01, lm, eps_clip_higher=0.02,
                                      importance_sampling_level="sequence", cu_seqlens=cu)
    tok, st = P.gspo(b, prox, adv, lm, seq_ids, n, 0.01, eps_clip_higher=0.02)
    got = P.token_mean(tok, lm, seq_ids, n)
    want.backward()
    got.backward()
    assert st["clip_mask"].any() and (~st["clip_mask"] & lm).any()
    assert abs(float(got) - float(want)) < 1e-9
    assert torch.allclose(a.grad, b.grad, atol=1e-9)


@pytest.mark.parametrize("areal_cfg,ours", [
    (RejectionSampling("token", "mask", upper=1.15, lower=0.87), ("token", "mask", 1.15, 0.87)),
    (RejectionSampling("token", "clamp", upper=1.1), ("token", "truncate", 1.1, None)),
    (RejectionSampling("sequence", "mask", upper=1.005, lower=0.9),
     ("geometric", "mask", 1.005, 0.9)),
    (RejectionSampling("sequence", "clamp", upper=1.005),
     ("geometric", "truncate", 1.005, None)),
])
def test_corrections_equal_areal_rejection_sampling(areal, areal_cfg, ours):
    lp, prox, behave, adv, lm, seq_ids, n, cu = _packed(2)
    res = areal.apply_rejection_sampling(prox, behave, lm, cu, areal_cfg)
    w, st = C.behaviour_correction(prox, behave, lm, seq_ids, n, *ours)
    assert torch.allclose(w.double(), res.behave_imp_weight.double(), atol=1e-6)
    changed = (~st["behave_mask"] & lm) | st["behave_truncated"]
    assert changed.any()
    assert abs(float(changed.sum()) / float(lm.sum()) - res.filtered_fraction) < 1e-12
    # and the whole decoupled PPO loss with that correction
    a, b = lp.clone().requires_grad_(True), lp.clone().requires_grad_(True)
    want, _ = areal.ppo_actor_loss_fn(a, prox, behave, adv, 0.2, lm, c_clip=3.0,
                                      rejection_sampling=areal_cfg, cu_seqlens=cu)
    tok, _ = P.ppo_clip(b, prox, adv, lm, seq_ids, n, 0.2, c_clip=3.0)
    got = P.token_mean(tok * w, lm, seq_ids, n)
    want.backward()
    got.backward()
    assert abs(float(got) - float(want)) < 1e-6
    assert torch.allclose(a.grad, b.grad, atol=1e-6)


def test_overlong_penalty_equals_areal(areal):
    L, buf, f = 12, 4, 0.5
    lm = torch.arange(L + 1)[None] < torch.arange(L + 1)[:, None]  # rows of 0..L tokens
    data = {"rewards": torch.zeros(L + 1), "input_ids": torch.zeros(L + 1, L + 1),
            "loss_mask": lm}
    want = areal.reward_overlong_penalty(data, buf, f, L)["rewards"]
    got = E.overlong_penalty(lm.sum(1), L, buf, f)
    assert torch.allclose(got, want.float(), atol=1e-7)
