"""The consistency gate (ARCHITECTURE invariant 9): what every server samples from, checked
against the trainer over the whole next-token distribution, at step 0 and after pushes.

Each check: rank 0 sends the same few probe prompts to every healthy server (``/generate``
with ``return_logprob`` and ``top_logprobs_num``, seeded sampling at the rollout's
temperature), and broadcasts the answers; every rank runs the trainer's no-grad forward
(``TrainEngine.forward`` with a hook: the public log-prob path) over prompt + generated tokens
and reads, at each generated position, its log-probs of the server's top-k tokens at the
trainer's temperature and its own argmax. ``consistency.gate_figures`` turns each server's
positions into KL over top-k plus tail, the largest log-prob gap, the argmax mismatch share
and the sampled-token gap. A server over a threshold (``weight_update.consistency``) is logged
as an error; with ``action: stop`` the run ends with ``ConsistencyGateError`` on every rank, as
a second checksum mismatch ends it (``verify.py``).

The weight checksum proves the bytes arrived; this proves the server computes the same
distribution with them (a kernel, a dtype, a temperature or a layer that differs).
It speaks SGLang's ``/generate`` (our embedded server, real SGLang); other backends skip it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from arealite.api.config.rollout import GenerationHyperparameters
from arealite.api.config.weights import ConsistencyGateConfig
from arealite.api.engine_api import TrainEngine
from arealite.api.trajectory import pad_sequences_to_tensors
from arealite.backends.sglang import sampling_params
from arealite.utils.distributed import rank0_decides
from arealite.utils.sync_http import post_json
from arealite.weights.consistency import gate_figures

logger = logging.getLogger("arealite.weights.consistency_gate")


class ConsistencyGateError(RuntimeError):
    """A server's next-token distribution is too far from the trainer's (``action: stop``)."""


@dataclass
class ProbeAnswer:
    """One server's answer to one probe: its tokens, and at each its top-k and sampled logp."""

    prompt: list[int]
    output_ids: list[int]
    top_logp: list[list[float]]  # [n_out][k], descending
    top_ids: list[list[int]]
    sampled_logp: list[float]


@dataclass
class GateResult:
    version: int
    per_server: dict[str, dict[str, float]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # addr -> why it is over a threshold
    unchecked: dict[str, str] = field(default_factory=dict)  # addr -> why it gave no figures

    def worst(self) -> dict[str, float]:
        """Each figure's largest value over the servers, and how many failed ({} when none
        was checked)."""
        if not self.per_server:
            return {}
        out = {
            key: max(f[key] for f in self.per_server.values())
            for key in next(iter(self.per_server.values()))
        }
        out["servers_failed"] = float(len(self.failed))
        return out


def parse_answer(prompt: list[int], item: Any, k: int) -> ProbeAnswer:
    """One ``/generate`` answer (docs/protocol.md: ``output_top_logprobs`` entries are
    ``[logprob, token_id, text]``; null logprobs are -inf). ValueError on a malformed one."""
    meta = item["meta_info"]
    out = [int(t) for t in item["output_ids"]]
    tops = meta.get("output_top_logprobs")
    if tops is None or len(tops) != len(out):
        raise ValueError("no output_top_logprobs of the output's length in the answer")
    top_logp, top_ids = [], []
    for pos in tops:
        if not pos or len(pos) < k:
            raise ValueError(f"a position with fewer than top_logprobs_num={k} entries")
        top_logp.append([float("-inf") if e[0] is None else float(e[0]) for e in pos[:k]])
        top_ids.append([int(e[1]) for e in pos[:k]])
    sampled = [
        float("-inf") if e[0] is None else float(e[0])
        for e in meta.get("output_token_logprobs") or []
    ]
    return ProbeAnswer(list(prompt), out, top_logp, top_ids, sampled)


def probe_server(
    addr: str,
    prompts: list[list[int]],
    cfg: ConsistencyGateConfig,
    gconfig: GenerationHyperparameters,
    headers: dict[str, str] | None = None,
) -> tuple[list[ProbeAnswer] | None, str]:
    """(answers, "") or (None, why) for one server: one batched ``/generate`` of all prompts."""
    body = {
        "input_ids": prompts,
        "sampling_params": {
            **sampling_params(gconfig, cfg.max_new_tokens),
            "sampling_seed": cfg.seed,
            "ignore_eos": True,
        },
        "return_logprob": True,
        "top_logprobs_num": cfg.top_k,
    }
    res, err = post_json(addr, "/generate", body, cfg.timeout, headers)
    if err is not None:
        return None, err
    items = res if isinstance(res, list) else [res]
    try:
        return [parse_answer(p, it, cfg.top_k) for p, it in zip(prompts, items, strict=True)], ""
    except (KeyError, TypeError, ValueError, IndexError) as e:
        return None, f"/generate: unexpected answer ({type(e).__name__}: {e})"


def _logit_chunks(logits: Any, temperature: float, chunk: int = 1024):
    """``(rows, fp32 logits / temperature)`` a chunk of rows at a time: from dense logits, or
    from the fused LM head's ``HeadInput`` (its ``chunks``), which has no ``[T, V]`` tensor."""
    if not isinstance(logits, torch.Tensor):
        yield from logits.chunks(temperature)
        return
    for i in range(0, logits.shape[0], chunk):
        sl = slice(i, min(i + chunk, logits.shape[0]))
        yield sl, logits[sl].float() / temperature


def trainer_view(
    engine: TrainEngine, answers: list[ProbeAnswer], temperature: float, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The trainer's log-probs of each answer's top-k ids and its argmax, at every generated
    position, concatenated over answers: ``([N, k], [N])``. Collective (FSDP forward)."""
    data = pad_sequences_to_tensors([{"input_ids": a.prompt + a.output_ids} for a in answers])
    # the ids to score at each token position (row t: the server's top-k for predicting token
    # t); the packing moves them into next-token alignment with the logits
    probe = torch.zeros(len(answers), data["input_ids"].shape[1], k, dtype=torch.long)
    for i, a in enumerate(answers):
        if a.top_ids:
            n_p = len(a.prompt)
            probe[i, n_p : n_p + len(a.top_ids)] = torch.tensor(a.top_ids, dtype=torch.long)
    data["probe_ids"] = probe

    def hook(logits: Any, mb: dict[str, torch.Tensor]) -> torch.Tensor:
        # next-token aligned: logits[i] predicts token i + 1, and packing shifted probe_ids
        ids = mb["probe_ids"].long()
        out = torch.empty(ids.shape[0], k + 1, dtype=torch.float32, device=ids.device)
        for sl, z in _logit_chunks(logits, temperature):
            logp = torch.log_softmax(z, dim=-1)
            out[sl, :k] = logp.gather(-1, ids[sl])
            out[sl, k] = logp.argmax(-1).float()
        return out

    out = engine.forward(data, post_hook=hook)  # [B, width, k + 1]
    lps, arg = [], []
    for i, a in enumerate(answers):
        sl = slice(len(a.prompt), len(a.prompt) + len(a.output_ids))
        lps.append(out[i, sl, :k])
        arg.append(out[i, sl, k].long())
    return torch.cat(lps), torch.cat(arg)


def judge(fig: dict[str, float], cfg: ConsistencyGateConfig) -> str:
    """Why ``fig`` fails the thresholds, or ""."""
    why = []
    for key, limit in (
        ("kl_mean", cfg.max_kl),
        ("argmax_mismatch", cfg.max_argmax_mismatch),
        ("max_logprob_gap", cfg.max_logprob_gap),
    ):
        if limit is not None and not fig[key] <= limit:  # NaN fails
            why.append(f"{key} {fig[key]:.4g} > {limit:g}")
    return ", ".join(why)


def server_figures(
    answers: list[ProbeAnswer], trainer_logp: torch.Tensor, trainer_argmax: torch.Tensor
) -> dict[str, float]:
    s_lp = torch.tensor([lp for a in answers for lp in a.top_logp], dtype=torch.float64)
    s_id = torch.tensor([ids for a in answers for ids in a.top_ids], dtype=torch.long)
    fig = gate_figures(
        s_lp.view(-1, trainer_logp.shape[-1]),
        s_id.view(-1, trainer_logp.shape[-1]),
        trainer_logp,
        trainer_argmax,
    )
    # the sampled token's gap, as the per-token agreement of the rollouts reads it
    sampled = torch.tensor([lp for a in answers for lp in a.sampled_logp], dtype=torch.float64)
    tok = torch.tensor([t for a in answers for t in a.output_ids], dtype=torch.long)
    rows = torch.arange(len(tok))
    hit = s_id == tok.view(-1, 1)  # the sampled token among the top-k (trainer's logp known)
    found = hit.any(-1)
    if len(sampled) == len(tok) and bool(found.any()):
        col = hit.float().argmax(-1)
        gap = (sampled - trainer_logp.double()[rows, col]).abs()[found]
        fig["sampled_logprob_gap"] = float(gap.max())
    else:
        fig["sampled_logprob_gap"] = 0.0
    return fig


class ConsistencyGate:
    """One run's gate; ``check`` on every rank together (rank 0 talks to the servers)."""

    def __init__(
        self,
        cfg: ConsistencyGateConfig,
        prompts: list[list[int]],
        gconfig: GenerationHyperparameters,
        trainer_temperature: float,
        rank: int,
        headers: dict[str, str] | None = None,
    ):
        self.cfg, self.prompts, self.gconfig = cfg, prompts, gconfig
        self.temperature, self.rank, self.headers = trainer_temperature, rank, headers
        self.pushes = 0
        self.last: GateResult | None = None

    def due_after_push(self) -> bool:
        self.pushes += 1
        return self.pushes % self.cfg.every == 0

    def check(self, engine: TrainEngine, addrs: list[str], version: int) -> GateResult:
        """Probe ``addrs`` (rank 0's list), score on every rank, judge; raises
        ``ConsistencyGateError`` on every rank when ``action: stop`` and a server failed."""
        box: list[Any] = [None]
        if self.rank == 0:
            box[0] = {
                a: probe_server(a, self.prompts, self.cfg, self.gconfig, self.headers)
                for a in addrs
            }
        if dist.is_initialized():
            dist.broadcast_object_list(box, src=0)
        res = GateResult(version)
        for addr, (answers, why) in box[0].items():
            if answers is None:
                res.unchecked[addr] = why
                continue
            lp, arg = trainer_view(engine, answers, self.temperature, self.cfg.top_k)
            fig = server_figures(answers, lp, arg)
            res.per_server[addr] = fig
            bad = judge(fig, self.cfg)
            if bad:
                res.failed[addr] = bad
        self._log(res)
        self.last = res
        if rank0_decides(bool(res.failed) and self.cfg.action == "stop"):
            raise ConsistencyGateError(
                f"weights v{version}: the servers' next-token distributions differ from the "
                f"trainer's: "
                + "; ".join(f"{a}: {w}" for a, w in res.failed.items())
                + " (weight_update.consistency.action=stop)"
            )
        return res

    def _log(self, res: GateResult) -> None:
        if self.rank != 0:
            return
        for addr, why in res.unchecked.items():
            logger.warning(
                "consistency gate v%d: server %s not checked (%s)", res.version, addr, why
            )
        for addr, fig in res.per_server.items():
            line = (
                f"v{res.version} server {addr}: KL(top-{self.cfg.top_k}+tail) mean "
                f"{fig['kl_mean']:.3g} max {fig['kl_max']:.3g}, max |dlogp| "
                f"{fig['max_logprob_gap']:.3g}, argmax differs on "
                f"{fig['argmax_mismatch']:.1%} of {int(fig['positions'])} positions"
            )
            if addr in res.failed:
                logger.error("CONSISTENCY GATE FAILED: %s (%s)", line, res.failed[addr])
            else:
                # the first pass says the gate runs and what it measures; later passes are in the
                # metrics (consistency/*) and at debug, not a console line every `every` pushes
                logger.log(logging.INFO if self.last is None else logging.DEBUG,
                           "consistency gate: %s", line)
