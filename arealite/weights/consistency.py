"""The consistency gate's arithmetic: how far a server's next-token distribution is from the
trainer's on the same positions, from the server's top-k alone (ARCHITECTURE invariant 9).

At each probed position the server reports its k most likely tokens with their log-probs
(``output_top_logprobs``); the trainer computes its log-probs of the same k tokens and its own
argmax. Both distributions are then read on k + 1 outcomes, the k tokens and "any other token"
(the tail, mass 1 - sum of the k probabilities), so the divergence is a true KL of two
distributions however small k is:

    KL(server || trainer) = sum_i p_i (log p_i - log q_i) + p_tail (log p_tail - log q_tail)

It is 0 exactly when both sides give the k tokens the same probabilities, and grows with any
difference in the head or in the mass left to the rest. Plain tensor functions; the test checks
them against a loop over positions.
"""

from __future__ import annotations

import torch

# A tail mass below this is read as this: the log of an exact 0 would be -inf, and two sides
# that both leave (numerically) nothing to the tail agree on it.
TAIL_FLOOR = 1e-12


def tail_log_mass(top_logp: torch.Tensor) -> torch.Tensor:
    """``log(1 - sum_i exp(top_logp[..., i]))`` over the last axis, floored at ``TAIL_FLOOR``."""
    head = torch.logsumexp(top_logp.double(), dim=-1)
    tail = -torch.expm1(head)  # 1 - exp(head), exact for head near 0
    return tail.clamp(min=TAIL_FLOOR).log()


def topk_tail_kl(server_logp: torch.Tensor, trainer_logp: torch.Tensor) -> torch.Tensor:
    """Per-position KL(server || trainer) over the server's top-k tokens plus the tail.

    ``server_logp`` and ``trainer_logp``: ``[N, k]``, both sides' log-probs of the server's k
    tokens at N positions. Returns ``[N]`` float64, each >= 0 up to rounding."""
    p_lp, q_lp = server_logp.double(), trainer_logp.double()
    p = p_lp.exp()
    # a token the server gives no mass adds nothing (0 * log 0 = 0), whatever the trainer says
    head = torch.where(p > 0, p * (p_lp - q_lp), torch.zeros_like(p)).sum(-1)
    p_tail, q_tail = tail_log_mass(p_lp), tail_log_mass(q_lp)
    return head + p_tail.exp() * (p_tail - q_tail)


def gate_figures(
    server_logp: torch.Tensor,
    server_ids: torch.Tensor,
    trainer_logp: torch.Tensor,
    trainer_argmax: torch.Tensor,
) -> dict[str, float]:
    """The gate's figures over N probed positions.

    ``server_logp`` / ``server_ids``: ``[N, k]`` the server's top-k (descending, so column 0
    is its argmax); ``trainer_logp``: ``[N, k]`` the trainer's log-probs of those ids;
    ``trainer_argmax``: ``[N]`` the trainer's most likely token. Returns ``kl_mean``,
    ``kl_max`` (KL over top-k plus tail), ``tail_mass`` (the server's mean mass outside its
    top-k), ``max_logprob_gap`` (the largest |server - trainer| log-prob over all k tokens and
    positions), ``argmax_mismatch`` (share of positions where the two argmaxes differ) and
    ``positions``."""
    n = int(server_logp.shape[0])
    if n == 0:
        return {
            "kl_mean": 0.0,
            "kl_max": 0.0,
            "tail_mass": 0.0,
            "max_logprob_gap": 0.0,
            "argmax_mismatch": 0.0,
            "positions": 0.0,
        }
    kl = topk_tail_kl(server_logp, trainer_logp).clamp(min=0.0)
    s_lp, t_lp = server_logp.double(), trainer_logp.double()
    gap = torch.where(s_lp == t_lp, torch.zeros_like(s_lp), (s_lp - t_lp).abs())  # -inf == -inf
    differ = server_ids[:, 0].long() != trainer_argmax.long()
    return {
        "kl_mean": float(kl.mean()),
        "kl_max": float(kl.max()),
        "tail_mass": float(tail_log_mass(server_logp).exp().mean()),
        "max_logprob_gap": float(gap.max()),
        "argmax_mismatch": float(differ.double().mean()),
        "positions": float(n),
    }
