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

import torch

TensorDict = dict[str, torch.Tensor]

# Stamped by the rollout executor on every accepted trajectory (see above).
EPISODE_IDS_KEY = "episode_ids"
DATA_EPOCHS_KEY = "data_epochs"

# Padding values per key; anything else pads with 0. versions pad with -1 (not generated).
PAD_VALUES: dict[str, int | float | bool] = {"versions": -1, "attention_mask": False, "loss_mask": False}


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
            ts = [
                torch.nn.functional.pad(t, (0, width - t.shape[1]), value=pads.get(k, 0))
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
        if isinstance(vals[0], (list, tuple)):
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
