"""A running row's next token: the step's logits adjusted (logit bias, penalties,
min_new_tokens, grammar masks), sampled with the batch's per-row settings, and the stop rules
that decide whether the token ends its row.

The engine (``engine.py``) owns the batch and the loop; this is what it asks once per step of
the logits it computed. The per-row settings are tensors rebuilt only when the batch's rows
change; the math is ``sampling.py``'s, the grammar's ``grammar.py``'s.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from servers.engine.grammar import GrammarStep
from servers.engine.model_runner import ModelRunner
from servers.engine.sampling import BatchSampling, apply_penalties, sample
from servers.engine.sequence import Sequence
from servers.protocol.request import compile_stop_regex


class NextToken:
    """The sampling state of one engine: its generator (``--random-seed``), the constrained
    rows' masks and matchers, and the batch's settings as tensors."""

    def __init__(self, runner: ModelRunner, random_seed: int | None = None) -> None:
        self.runner = runner
        self.generator = torch.Generator(device=runner.device)
        self.generator.manual_seed(random_seed if random_seed is not None else int(time.time()))
        self.grammar = GrammarStep()  # constrained rows' masks and matchers
        self._batch_key: tuple = ()
        self._batch: BatchSampling | None = None

    def sample(self, seqs: list[Sequence], logits: torch.Tensor
               ) -> tuple[list[int], list[float], dict[int, list[tuple[float, int]]]]:
        """Each row's token, its logprob, and its top logprobs where the row asked for them;
        ``logits`` is adjusted in place first (``adjust_logits``)."""
        dev = logits.device
        vocab = logits.shape[-1]
        self.adjust_logits(seqs, logits)
        # Keyed by serials, never by id(): a freed Sequence's id can be reused by a new one in
        # the same row, which would then inherit the old row's temperature, top-k and top-p.
        key = tuple([s.serial for s in seqs])
        if self._batch_key != key:  # the rows changed: rebuild the per-row settings
            params = [s.params for s in seqs]
            self._batch_key = key
            self._batch = BatchSampling(
                temperatures=torch.tensor([p.temperature for p in params], device=dev),
                top_ks=torch.tensor([min(p.top_k, vocab) for p in params], device=dev),
                top_ps=torch.tensor([p.top_p for p in params], device=dev),
                min_ps=torch.tensor([p.min_p for p in params], device=dev),
                seeds=torch.tensor([p.sampling_seed or 0 for p in params], device=dev),
                seeded=torch.tensor([p.sampling_seed is not None for p in params], device=dev),
                positions=torch.zeros(len(seqs), dtype=torch.long, device=dev),
                all_greedy=all(p.greedy for p in params),
                needs_filter=any(p.top_k < vocab or p.top_p < 1.0 or p.min_p > 0.0 for p in params),
            )
        batch = self._batch
        if bool(batch.seeded.any()):
            batch.positions = torch.tensor([s.total_len() for s in seqs], device=dev)
        toks, logp, full = sample(logits, batch, self.generator)
        tops: dict[int, list[tuple[float, int]]] = {}
        for i, s in enumerate(seqs):
            if s.top_logprobs_num > 0:
                tv, ti = full[i].topk(min(s.top_logprobs_num, vocab))
                tops[i] = list(zip(tv.tolist(), ti.tolist()))
        return toks.tolist(), logp.tolist(), tops

    def adjust_logits(self, seqs: list[Sequence], logits: torch.Tensor) -> None:
        """Logit bias, penalties and min_new_tokens (SGLang applies these before sampling)."""
        pen_rows = []
        for i, s in enumerate(seqs):
            p = s.params
            if p.logit_bias:
                ids = torch.tensor(list(p.logit_bias), device=logits.device)
                logits[i, ids] += torch.tensor(list(p.logit_bias.values()), device=logits.device)
            if p.has_penalty:
                pen_rows.append(i)
            if p.min_new_tokens > len(s.output_ids):
                # SGLang's min_new_tokens penalizer bans stop ids and EOS whatever ignore_eos says
                banned = set(p.stop_token_ids) | self.runner.eos_token_ids
                if banned:
                    logits[i, torch.tensor(sorted(banned), device=logits.device)] = float("-inf")
        if pen_rows:
            apply_penalties(
                logits, pen_rows, [(seqs[i].prompt, seqs[i].output_ids) for i in pen_rows],
                [seqs[i].params.frequency_penalty for i in pen_rows],
                [seqs[i].params.presence_penalty for i in pen_rows],
                [seqs[i].params.repetition_penalty for i in pen_rows],
            )
        # Grammar masks last, on the penalised and biased logits (SGLang: apply_logits_bias), so
        # the reported logprob of a constrained token is in the grammar-restricted distribution.
        self.grammar.mask(logits, seqs)

    def stop_reason(self, s: Sequence, tok: int) -> dict[str, Any] | None:
        """The finish reason ``tok`` gives row ``s`` (SGLang's ``finish_reason``), or None."""
        p = s.params
        # ignore_eos turns off every token-based stop, stop_token_ids included (SGLang's
        # Req._check_token_based_finish returns first thing when it is set).
        if not p.ignore_eos and (tok in p.stop_token_ids or tok in self.runner.eos_token_ids):
            return {"type": "stop", "matched": tok}
        if p.stop or p.stop_regex:
            tail = self._tail_text(s)
            for stop in p.stop:
                if stop and stop in tail:
                    return {"type": "stop", "matched": stop}
            for pattern in p.stop_regex:
                m = compile_stop_regex(pattern).search(tail)
                if m:
                    return {"type": "stop", "matched": m.group(0)}
        if len(s.output_ids) >= s.max_new_tokens:
            return {"type": "length", "length": len(s.output_ids)}
        if s.grammar is not None and s.grammar.ended:  # SGLang: FINISH_MATCHED_TOKEN
            return {"type": "stop", "matched": tok}
        return None

    def _tail_text(self, s: Sequence) -> str:
        tok = self.runner.tokenizer
        if tok is None:
            return ""
        longest = max([len(x) for x in s.params.stop] + [64 if s.params.stop_regex else 0])
        return tok.decode(s.output_ids[-(longest + 2):], skip_special_tokens=False)
