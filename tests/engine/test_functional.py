"""Every function of arealite.engine.functional against a slow, obviously-correct loop."""

from __future__ import annotations

import math

import pytest
import torch

from arealite.engine import functional as F
from tests.support.random_batch import TOL, rand_batch

# ----------------------------------------------------------------------------- logprobs


@pytest.mark.parametrize("temperature,chunk", [(1.0, 1024), (0.7, 3), (1.3, 1)])
def test_gather_logprobs_matches_loop(temperature, chunk):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(11, 17, generator=g, dtype=torch.float64).float() * 3
    labels = torch.randint(0, 17, (11,), generator=g)
    got = F.gather_logprobs(logits, labels, temperature, chunk_size=chunk)
    got2, ent = F.gather_logprobs_entropy(logits, labels, temperature, chunk_size=chunk)
    for i in range(11):
        z = [float(x) / temperature for x in logits[i]]
        lse = math.log(sum(math.exp(v) for v in z))
        ref = z[int(labels[i])] - lse
        ref_ent = -sum(math.exp(v - lse) * (v - lse) for v in z)
        assert abs(float(got[i]) - ref) < 1e-5 and abs(float(got2[i]) - ref) < 1e-5
        assert abs(float(ent[i]) - ref_ent) < 1e-5


def test_gather_logprobs_gradient_equals_log_softmax():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(7, 13, generator=g, requires_grad=True)
    b = a.detach().clone().requires_grad_(True)
    labels = torch.randint(0, 13, (7,), generator=g)
    F.gather_logprobs(a, labels, 0.9, chunk_size=2).sum().backward()
    torch.log_softmax(b / 0.9, -1).gather(-1, labels[:, None]).sum().backward()
    assert torch.allclose(a.grad, b.grad, atol=TOL)


def test_bad_temperature_is_an_error():
    with pytest.raises(ValueError, match="temperature"):
        F.gather_logprobs(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), 0.0)


# ----------------------------------------------------------------------------- normalisation


def test_masked_normalization_matches_loop():
    g, _, lm = rand_batch(2)
    x = torch.randn(lm.shape, generator=g)
    for unbiased in (False, True):
        got = F.masked_normalization(x, lm, unbiased=unbiased, eps=1e-5)
        vals = [float(x[i, j]) for i in range(lm.shape[0]) for j in range(lm.shape[1]) if lm[i, j]]
        n = len(vals)
        mean = sum(vals) / n
        var = sum((v - mean) ** 2 for v in vals) / (n - 1 if unbiased else n)
        for i in range(lm.shape[0]):
            for j in range(lm.shape[1]):
                ref = (float(x[i, j]) - mean) / (math.sqrt(var) + 1e-5) if lm[i, j] else 0.0
                assert abs(float(got[i, j]) - ref) < TOL
