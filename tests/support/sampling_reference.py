"""A slow reference for SGLang's sampling rules, to check a server's answers token by token.

Written independently of ``servers/engine/sampling.py``: plain loops over one teacher-forced forward.
"""

from __future__ import annotations

import torch

TOL = 1e-4  # batched KV-cache forward vs one full forward, float32


def reference_logits(logits: torch.Tensor, prompt: list[int], out: list[int], sp: dict):
    """SGLang's penalties by a plain loop: frequency/presence over output so far, repetition
    over prompt + output (divide positive logits, multiply negative ones)."""
    logits = logits.clone()
    freq, pres = sp.get("frequency_penalty", 0.0), sp.get("presence_penalty", 0.0)
    for tok in set(out):
        logits[tok] -= freq * out.count(tok) + pres
    rep = sp.get("repetition_penalty", 1.0)
    if rep != 1.0:
        for tok in set(prompt + out):
            v = logits[tok].item()
            logits[tok] = v / rep if v > 0 else v * rep
    return logits


def check_against_own_settings(model, rec: dict) -> None:
    """``rec``: prompt, output_ids, logprobs, rid and the raw ``sp`` (SGLang sampling_params)
    of one response; every token is checked against a teacher-forced forward of ``model``."""
    prompt, out, lps, sp = rec["prompt"], rec["output_ids"], rec["logprobs"], rec["sp"]
    greedy = sp["temperature"] == 0.0
    temp = 1.0 if greedy else sp["temperature"]  # SGLang: greedy reports logprobs at T = 1
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out])).logits[0].float()
    assert len(out) == len(lps) and len(out) <= sp["max_new_tokens"]
    for j, tok in enumerate(out):
        row = reference_logits(logits[len(prompt) - 1 + j], prompt, out[:j], sp)
        lp = torch.log_softmax(row / temp, -1)
        where = f"request {rec['rid']} ({sp}) token {j}"
        assert abs(lp[tok].item() - lps[j]) < TOL, f"{where}: logprob {lps[j]} != {lp[tok].item()}"
        if greedy:
            assert lp[tok].item() >= lp.max().item() - TOL, f"{where}: greedy token is not the argmax"
        if sp.get("top_k", -1) > 0:
            above = int((lp > lp[tok] + TOL).sum())
            assert above < sp["top_k"], f"{where}: token ranks {above} >= top_k {sp['top_k']}"
        if sp.get("top_p", 1.0) < 1.0:
            probs = lp.exp()
            mass_before = float(probs[probs > probs[tok] + TOL].sum())
            assert mass_before <= sp["top_p"] + TOL, f"{where}: outside top_p {sp['top_p']}"
