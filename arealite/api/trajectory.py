"""The trajectory contract: what a ``RolloutWorkflow`` returns and the trainer consumes.

A trajectory is a ``dict`` of tensors (``TensorDict``), all with leading dimension ``B`` (one
row per sample), right-padded along dim 1:

- ``input_ids``      ``[B, S]`` int64  prompt + completion tokens (pad id 0 past the end)
- ``attention_mask`` ``[B, S]`` bool   True on real tokens (a prefix of each row)
- ``loss_mask``      ``[B, S]`` bool   True on tokens the policy generated and is trained on
- ``logprobs``       ``[B, S]`` float32 behaviour logprob of ``input_ids[b, t]`` (0 where not generated)
- ``versions``       ``[B, S]`` int64  weight version that generated ``input_ids[b, t]``;
                                       -1 on prompt, feedback and padding tokens
- ``rewards``        ``[B]``    float32 scalar reward per sample

Optional: ``routed_experts`` ``[B, S, L*k]`` int32, a mixture-of-experts model's routing of each
token *as input* (layer-major, ``top_k`` ids per layer, as the server chose them; not shifted to
the next token like the per-token values above), -1 on rows with no routing (the last token of
each row, which the server never fed, and padding): the trainer's routing replay reads it.

Further keys are allowed when their leading dimension is ``B`` (e.g. ``sample_ids [B]``, the
row's integer ``id``). The rollout executor adds two to every trajectory it accepts, whatever the
workflow: ``episode_ids [B]`` int64 (the episode's serial number in the run: no two episodes
share one, also across a recovery) and ``data_epochs [B]`` int64 (the epoch its dataloader row
was drawn in, -1 for rows given directly); the run's ledger (``observe/sample_log.py``) records
them per step.
``pad_sequences_to_tensors`` builds one from python lists, ``concat_padded_tensors`` joins
trajectories of different lengths, ``check_trajectory`` is what the executor enforces on every
workflow's return value. A workflow returns ``None`` to reject an episode (it is counted, never
trained on). One module for all of it, so the pad values cannot disagree between the workflow
that pads and the executor that concatenates.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

TensorDict = dict[str, torch.Tensor]

# Stamped by the rollout executor on every accepted trajectory (see above).
EPISODE_IDS_KEY = "episode_ids"
DATA_EPOCHS_KEY = "data_epochs"

# Padding values per key; anything else pads with 0. versions pad with -1 (not generated).
PAD_VALUES: dict[str, int | float | bool] = {"versions": -1, "attention_mask": False, "loss_mask": False,
                                             "routed_experts": -1}
ROUTED_EXPERTS = "routed_experts"


class RoutedExpertsError(ValueError):
    """Routed experts that do not fit their tokens (length or width)."""


def join_routed_experts(known: np.ndarray | None, new: np.ndarray, start: int = 0) -> np.ndarray:
    """Rows ``[0, len(known))`` already held, joined with ``new`` (rows from ``start`` on, as a
    server reports them from ``routed_experts_start_len``): the rows held stay (they are the
    routing the earlier tokens were generated with), ``new`` adds the rows past them."""
    if known is None or len(known) == 0:
        if start != 0:
            raise RoutedExpertsError(f"routed experts start at row {start} with no earlier rows")
        return new
    if start > len(known):
        raise RoutedExpertsError(f"routed experts start at row {start}, after the {len(known)} held")
    if new.shape[1:] != known.shape[1:]:
        raise RoutedExpertsError(f"routed experts of width {new.shape[1:]} join rows of width "
                                 f"{known.shape[1:]}")
    return np.concatenate([known, new[len(known) - start:]])


def routed_experts_row(rows: np.ndarray, n_tokens: int) -> torch.Tensor:
    """A sample's ``[n_tokens - 1, W]`` routed experts as its ``[n_tokens, W]`` trajectory value
    (-1 on the last token, which no forward fed)."""
    if rows.ndim != 2 or len(rows) != n_tokens - 1:
        raise RoutedExpertsError(f"{len(rows)} rows of routed experts for {n_tokens} tokens "
                                 f"(expected {n_tokens - 1})")
    out = torch.full((n_tokens, rows.shape[1]), -1, dtype=torch.int32)
    out[:-1] = torch.from_numpy(np.array(rows, dtype=np.int32))  # a copy: the wire's buffer is read-only
    return out


def check_trajectory(traj: Any) -> None:
    """A workflow's return value must be a dict of tensors sharing their leading dimension."""
    if not isinstance(traj, dict) or not traj:
        raise TypeError(f"arun_episode must return a non-empty dict of tensors or None, got {type(traj).__name__}")
    sizes = set()
    for k, v in traj.items():
        if not isinstance(v, torch.Tensor) or v.dim() == 0:
            raise TypeError(f"trajectory key {k!r} is not a tensor with a batch dimension")
        sizes.add(v.shape[0])
    if len(sizes) != 1:
        raise ValueError(f"trajectory tensors disagree on the batch dimension: {sorted(sizes)}")


def concat_padded_tensors(items: Sequence[TensorDict], pad_values: dict | None = None) -> TensorDict:
    """Concatenate trajectory dicts along dim 0, right-padding 2-D values to the longest row."""
    if not items:
        return {}
    pads = {**PAD_VALUES, **(pad_values or {})}
    keys = list(items[0])
    for i, it in enumerate(items):
        if list(it) != keys and set(it) != set(keys):
            raise ValueError(f"trajectory {i} has keys {sorted(it)}, expected {sorted(keys)}")
    out: TensorDict = {}
    for k in keys:
        ts = [it[k] for it in items]
        if ts[0].dim() >= 2:
            width = max(t.shape[1] for t in ts)
            inner = (0, 0) * (ts[0].dim() - 2)  # pad dim 1 only, whatever follows it
            ts = [
                torch.nn.functional.pad(t, (*inner, 0, width - t.shape[1]), value=pads.get(k, 0))
                if t.shape[1] < width
                else t
                for t in ts
            ]
        out[k] = torch.cat(ts, dim=0)
    return out


def pad_sequences_to_tensors(
    seqs: Sequence[dict[str, list]], pad_values: dict | None = None
) -> TensorDict:
    """Rows of python lists (``input_ids``, ``loss_mask``, ``logprobs``, ``versions``, ...) ->
    a padded trajectory dict with an ``attention_mask``. Scalar values become ``[B]`` tensors."""
    if not seqs:
        return {}
    pads = {**PAD_VALUES, **(pad_values or {})}
    width = max(len(s["input_ids"]) for s in seqs)
    out: TensorDict = {}
    for k in seqs[0]:
        vals = [s[k] for s in seqs]
        if isinstance(vals[0], torch.Tensor) and vals[0].dim() >= 1:  # [len, ...] per row
            t = torch.full((len(vals), width, *vals[0].shape[1:]), pads.get(k, 0), dtype=vals[0].dtype)
            for i, v in enumerate(vals):
                t[i, : len(v)] = v
            out[k] = t
        elif isinstance(vals[0], (list, tuple)):
            dtype = torch.float32 if k == "logprobs" else (torch.bool if k.endswith("mask") else torch.long)
            t = torch.full((len(vals), width), pads.get(k, 0), dtype=dtype)
            for i, v in enumerate(vals):
                t[i, : len(v)] = torch.as_tensor(v, dtype=dtype)
            out[k] = t
        else:
            out[k] = torch.as_tensor(vals, dtype=torch.float32 if isinstance(vals[0], float) else None)
    if "attention_mask" not in out:
        am = torch.zeros(len(seqs), width, dtype=torch.bool)
        for i, s in enumerate(seqs):
            am[i, : len(s["input_ids"])] = True
        out["attention_mask"] = am
    return out
