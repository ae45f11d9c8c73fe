"""DPO / IPO / KTO updates over any ``TrainEngine`` through ``train_batch(loss_fn)``.

A preference loss couples rows (DPO's chosen and rejected completion, KTO's batch reference
point), while ``train_batch`` may split a batch into micro-batches anywhere. So one update is
two passes: a no-grad forward gives every row's sequence log-probability, autograd of the
batch loss with respect to those numbers gives each row's coefficient
``c_i = dL / d logp_i``, and ``train_batch`` then minimises the per-row surrogate
``Σ_i c_i · logp_i(θ)``, whose gradient at the current weights is exactly ``∇L`` (for a
deterministic forward: no dropout). The reference model's log-probabilities are computed once
per batch with its own no-grad forward.

Batch layout (``build_sft_batch`` rows): DPO interleaves ``[chosen_0, rejected_0, chosen_1,
...]``; KTO has one row per example and a ``[B]`` bool ``desirable`` key, plus a second batch
of mismatched (prompt, another row's completion) pairs for the reference point.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from arealite.api.engine_api import TrainEngine
from arealite.api.trajectory import TensorDict
from arealite.engine.functional import gather_logprobs
from arealite.engine.ppo.policy_losses import packed_seq_ids
from arealite.engine.preference.losses import chosen_nll, dpo_loss, kto_loss, kto_reference_point


@torch.no_grad()
def sequence_logps(engine: TrainEngine, data: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed completion (``loss_mask``) log-probability of each row, float64 ``[B]``, and the
    completion lengths ``[B]``."""
    tok = engine.forward(data, post_hook=lambda logits, mb: gather_logprobs(
        logits, mb["labels"], mask=mb["loss_mask"]))
    lm = data["loss_mask"].bool()
    return torch.where(lm, tok.double(), 0.0).sum(1), lm.sum(1).double()


def _surrogate_loss(logits: torch.Tensor, mb: TensorDict) -> torch.Tensor:
    """``Σ_rows coef · logp_row / rows``; the micro-batch weight is its row count, and
    ``pref_coef`` carries the global row count, so the weighted mean is ``Σ c_i logp_i``."""
    lm = mb["loss_mask"].bool()
    ids, n = packed_seq_ids(mb["cu_seqlens"])
    lp = gather_logprobs(logits, mb["labels"], mask=lm)
    return (mb["pref_coef"].to(lp.dtype)[ids] * lp).sum() / max(n, 1)


def _row_count(mb: TensorDict) -> float:
    return float(len(mb["cu_seqlens"]) - 1)


def surrogate_update(engine: TrainEngine, data: TensorDict, values: torch.Tensor,
                     batch_loss: Callable[[torch.Tensor], torch.Tensor],
                     surrogate_loss: Callable[[torch.Tensor, TensorDict], torch.Tensor],
                     ) -> dict[str, float]:
    """One optimizer step of a loss that couples rows: ``values`` ``[B]`` are the rows' numbers
    from a no-grad forward (sequence log-probabilities, reward scores), ``batch_loss(values)``
    the batch loss; ``surrogate_loss(out, mb)`` is ``Σ_rows pref_coef · value_row / rows`` of a
    packed micro-batch, recomputed with grad (see the module comment)."""
    x = values.clone().requires_grad_(True)
    loss = batch_loss(x)
    (coef,) = torch.autograd.grad(loss, x)
    rows = dict(data)
    rows["pref_coef"] = (coef * len(coef)).float()
    out = engine.train_batch(rows, surrogate_loss, _row_count)
    engine.step_lr_scheduler()
    return {"loss": float(loss.detach()), "grad_norm": out["grad_norm"], "lr": out["lr"],
            "update_successful": out["update_successful"], "n_mbs": out["n_mbs"]}


class PreferenceActor:
    """``engine`` is trained; ``ref`` is the frozen reference (an engine without optimizer).
    ``sft_weight`` > 0 adds that times the chosen completions' token-mean NLL to DPO / IPO."""

    def __init__(self, engine: TrainEngine, ref: TrainEngine, beta: float = 0.1,
                 sft_weight: float = 0.0):
        self.engine, self.ref, self.beta, self.sft_weight = engine, ref, beta, sft_weight

    def _update(self, data: TensorDict, logp: torch.Tensor,
                batch_loss: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, float]:
        return surrogate_update(self.engine, data, logp, batch_loss, _surrogate_loss)

    def _dpo(self, data: TensorDict, loss_type: str):
        if data["loss_mask"].shape[0] % 2:
            raise ValueError("DPO batches interleave chosen and rejected rows: an even count")
        ref, n_tok = sequence_logps(self.ref, data)
        logp, _ = sequence_logps(self.engine, data)

        def batch_loss(x: torch.Tensor) -> torch.Tensor:
            losses, _, _ = dpo_loss(x[0::2], x[1::2], ref[0::2], ref[1::2], self.beta,
                                    loss_type, n_tok[0::2], n_tok[1::2])
            if self.sft_weight:
                return losses.mean() + self.sft_weight * chosen_nll(x[0::2], n_tok[0::2])
            return losses.mean()

        rc = self.beta * (logp[0::2] - ref[0::2])
        rr = self.beta * (logp[1::2] - ref[1::2])
        stats = {"rewards/chosen": float(rc.mean()), "rewards/rejected": float(rr.mean()),
                 "rewards/margin": float((rc - rr).mean()),
                 "rewards/accuracy": float((rc > rr).double().mean()),
                 "chosen_nll": float(chosen_nll(logp[0::2], n_tok[0::2]))}
        return logp, batch_loss, stats

    def _kto(self, data: TensorDict, mismatched: TensorDict, desirable_weight: float,
             undesirable_weight: float):
        ref, _ = sequence_logps(self.ref, data)
        logp, _ = sequence_logps(self.engine, data)
        z0 = kto_reference_point(sequence_logps(self.engine, mismatched)[0],
                                 sequence_logps(self.ref, mismatched)[0],
                                 getattr(self.engine, "dp_group", None),
                                 getattr(self.engine, "device", None))
        good = data["desirable"].bool()

        def batch_loss(x: torch.Tensor) -> torch.Tensor:
            losses, _ = kto_loss(x, ref, good, z0, self.beta, desirable_weight,
                                 undesirable_weight)
            return losses.mean()

        r = self.beta * (logp - ref)
        stats = {"kto/reference_point": z0,
                 "rewards/desirable": float(r[good].mean()) if good.any() else 0.0,
                 "rewards/undesirable": float(r[~good].mean()) if (~good).any() else 0.0}
        return logp, batch_loss, stats

    def dpo_step(self, data: TensorDict, loss_type: str = "sigmoid") -> dict[str, float]:
        """One optimizer step of DPO (``sigmoid``) or IPO (``ipo``) on interleaved pairs."""
        logp, batch_loss, stats = self._dpo(data, loss_type)
        return {**self._update(data, logp, batch_loss), **stats}

    def kto_step(self, data: TensorDict, mismatched: TensorDict, desirable_weight: float = 1.0,
                 undesirable_weight: float = 1.0) -> dict[str, float]:
        """One optimizer step of KTO; ``mismatched`` gives the reference point ``z0``."""
        logp, batch_loss, stats = self._kto(data, mismatched, desirable_weight,
                                            undesirable_weight)
        return {**self._update(data, logp, batch_loss), **stats}

    @torch.no_grad()
    def evaluate(self, data: TensorDict, loss_type: str = "sigmoid",
                 mismatched: TensorDict | None = None, desirable_weight: float = 1.0,
                 undesirable_weight: float = 1.0) -> dict[str, float]:
        """The loss and reward statistics of a held-out batch, without an update
        (``loss_type="kto"`` needs ``mismatched``)."""
        if loss_type == "kto":
            if mismatched is None:
                raise ValueError("KTO evaluation needs the mismatched batch")
            logp, batch_loss, stats = self._kto(data, mismatched, desirable_weight,
                                                undesirable_weight)
        else:
            logp, batch_loss, stats = self._dpo(data, loss_type)
        return {"loss": float(batch_loss(logp)), **stats}
