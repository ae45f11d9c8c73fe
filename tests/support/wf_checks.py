"""Assertions on the trajectory contract of ``arealite.api.trajectory``, shared by workflow tests."""

from __future__ import annotations

import torch


def assert_trajectory(traj: dict, batch: int, prompt_lens: list[int] | None = None) -> None:
    ids, am, lm = traj["input_ids"], traj["attention_mask"], traj["loss_mask"]
    lp, ver, rw = traj["logprobs"], traj["versions"], traj["rewards"]
    B, S = ids.shape
    assert B == batch
    assert ids.dtype == torch.int64 and am.dtype == torch.bool and lm.dtype == torch.bool
    assert lp.dtype == torch.float32 and ver.dtype == torch.int64 and rw.dtype == torch.float32
    for t in (am, lm, lp, ver):
        assert t.shape == (B, S)
    assert rw.shape == (B,)
    for k, v in traj.items():
        assert v.shape[0] == B, k
    lens = am.sum(1)
    for b in range(B):
        n = int(lens[b])
        assert am[b, :n].all() and not am[b, n:].any(), "attention_mask must be a prefix"
        assert (ids[b, n:] == 0).all(), "padding ids are 0"
        assert not lm[b, n:].any() and (ver[b, n:] == -1).all() and (lp[b, n:] == 0).all()
        # generated tokens carry a version >= 0 and a logprob <= 0; all others -1 and 0
        assert (ver[b][lm[b]] >= 0).all() and (ver[b][~lm[b]] == -1).all()
        assert (lp[b][~lm[b]] == 0).all() and (lp[b][lm[b]] <= 0).all()
        if prompt_lens is not None:
            p = prompt_lens[b]
            assert not lm[b, :p].any() and (ver[b, :p] == -1).all()


def recompute_logprobs(model, ids: torch.Tensor, n: int) -> torch.Tensor:
    """logprob of ids[t] given ids[:t] for t in [1, n) under ``model`` (temperature 1)."""
    with torch.no_grad():
        logits = model(input_ids=ids[:n].unsqueeze(0)).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    out = torch.zeros(n)
    out[1:] = logp[torch.arange(n - 1), ids[1:n]]
    return out
