"""Structured outputs: grammar constraints enforced token by token, with xgrammar (SGLang's
default grammar backend).

A constrained sequence carries a ``Constraint`` (one xgrammar matcher). Each engine step, the
rows that carry one get their grammar's mask added to their logits (every token outside it is
-inf) before sampling; rows without a constraint are not touched and no work is done when no
row has one. Feeding the sampled token to the matcher and building the next mask run in a
worker thread during the next forward (SGLang overlaps its grammar work with the forward too);
the step waits for it before sampling. ``GrammarStep`` is that per-step work, the engine's
only grammar call sites. A sampled stop token ends the grammar and the sequence
(the mask allows one only where the grammar may end), as SGLang's ``Req.check_finished``.

Logprob convention (SGLang's): the mask is applied to the logits in place with the penalties
and the logit bias (``SamplingBatchInfo.apply_logits_bias`` in SGLang's ``ModelRunner.sample``)
and the sampler takes ``log_softmax(logits / T)`` of those masked logits, so the log-prob
reported for a constrained token is in the grammar-restricted distribution (renormalised over
the allowed tokens). The trainer recomputes over the full vocabulary: masks are not replayed
(docs/structured_outputs.md).

The compiler is built once per server, on the first constrained request (building the
tokenizer table takes a moment), and caches compiled grammars, so the same schema compiles
once.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import threading
from typing import Any

import torch

from servers.protocol.request import ANY_JSON, GrammarSpec


class Constraint:
    """One sequence's grammar state (an xgrammar ``GrammarMatcher``).

    The engine thread reads ``ended`` / ``rejected`` and takes ``next_mask``; between two steps
    a worker thread runs ``advance`` (feed the sampled token, build the next mask) while the
    next forward runs, so only the mask's addition to the logits stays in the step."""

    def __init__(self, compiled: Any) -> None:
        import xgrammar as xgr

        self.matcher = xgr.GrammarMatcher(compiled)
        self.vocab_size = int(compiled.tokenizer_info.vocab_size)
        self.stop_ids = frozenset(int(t) for t in self.matcher.stop_token_ids)
        self.ended = False  # a stop token was sampled: the grammar is complete (SGLang: terminated)
        self.rejected = False  # the matcher refused a sampled token (every allowed one was banned)
        self._next: torch.Tensor | None = None  # additive mask (0 / -inf) for the next token

    def accept(self, token: int) -> bool:
        return bool(self.matcher.accept_token(int(token)))

    def sampled(self, token: int) -> bool:
        """Record a sampled token in the engine thread; True when it must go to ``advance``.
        The mask allows a stop token only where the grammar may end, so sampling one ends it."""
        if int(token) in self.stop_ids:
            self.ended = True
            return False
        return True

    def advance(self, token: int) -> None:
        """Feed ``token`` to the matcher and build the next mask (worker thread)."""
        if not self.accept(token):
            self.rejected = True
        elif not self.matcher.is_terminated():
            self._next = self._mask()

    def next_mask(self) -> torch.Tensor:
        """The additive mask for the next token (built now when no ``advance`` prepared it)."""
        mask, self._next = self._next, None
        return mask if mask is not None else self._mask()

    def _mask(self) -> torch.Tensor:
        import xgrammar as xgr

        bits = xgr.allocate_token_bitmask(1, self.vocab_size)
        self.matcher.fill_next_token_bitmask(bits, 0)
        add = torch.zeros(1, self.vocab_size)
        xgr.apply_token_bitmask_inplace(add, bits)
        return add[0]


def advance_all(jobs: list[tuple[Constraint, int]]) -> None:
    for c, tok in jobs:
        c.advance(tok)


class GrammarStep:
    """An engine's per-step grammar work: ``mask`` before sampling (wait for the worker, add
    the masks of the rows with a live grammar), ``sampled`` after it (end grammars on a sampled
    stop token, hand the other constrained tokens to the worker, which feeds the matchers and
    builds the next masks while the next forward runs). Rows are objects with ``.grammar``
    (a ``Constraint`` or None) and ``.finished``. Used by the engine thread only."""

    def __init__(self) -> None:
        self._pool = cf.ThreadPoolExecutor(1, thread_name_prefix="grammar")
        self._job: cf.Future | None = None

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False)

    def mask(self, logits: torch.Tensor, seqs: list[Any]) -> None:
        """Set every token a live grammar forbids to -inf in its row, in place."""
        if self._job is not None:
            self._job.result()  # the last step's matchers are fed and masks built
            self._job = None
        rows = [
            i
            for i, s in enumerate(seqs)
            if s.grammar is not None and not s.grammar.ended and not s.grammar.rejected
        ]
        if rows:
            apply_constraints(logits, rows, [seqs[i].grammar for i in rows])

    def sampled(self, seqs: list[Any], tokens: list[int]) -> list[Any]:
        """Record each constrained row's sampled token; returns the rows whose previous token
        the matcher refused (they end with an error)."""
        jobs, rejected = [], []
        for s, tok in zip(seqs, tokens):
            g = s.grammar
            if g is None or g.ended or s.finished:
                continue
            if g.rejected:  # only when every allowed token was banned (min_new_tokens)
                rejected.append(s)
            elif g.sampled(tok):
                jobs.append((g, tok))
        if jobs:
            self._job = self._pool.submit(advance_all, jobs)
        return rejected


def apply_constraints(logits: torch.Tensor, rows: list[int], constraints: list[Constraint]) -> None:
    """Set every token a row's grammar forbids to -inf, in place, for the listed rows (the
    masks' columns past the grammar's vocabulary, padding of the logits, stay as they are)."""
    add = torch.stack([c.next_mask() for c in constraints]).to(logits.device, logits.dtype)
    idx = torch.tensor(rows, device=logits.device)
    width = min(add.shape[-1], logits.shape[-1])
    logits[idx, :width] += add[:, :width]


def tool_call_pieces(tools: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The pieces of a Qwen2.5 tool call (``servers.protocol.tool_parser``'s format) for each
    tool: ``<tool_call>\\n{"name": "<name>", "arguments": <its parameters schema>}\\n</tool_call>``.
    Returns ``(prefix, parameters schema as JSON)`` per tool; the suffix is fixed."""
    out = []
    for t in tools:
        fn = t["function"]
        params = fn.get("parameters") or {"type": "object"}
        prefix = '<tool_call>\n{"name": ' + json.dumps(fn["name"]) + ', "arguments": '
        out.append((prefix, json.dumps(params)))
    return out


TOOL_CALL_SUFFIX = "}\n</tool_call>"


class GrammarBackend:
    """xgrammar's compiler for one tokenizer; ``compile`` raises ``ValueError`` (a 400)."""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        stop_token_ids: list[int],
        any_whitespace: bool = True,
        max_whitespace_cnt: int | None = None,
    ) -> None:
        import xgrammar as xgr

        self._xgr = xgr
        # SGLang's --constrained-json-disable-any-whitespace / --constrained-json-max-whitespace-cnt
        self.json_whitespace = {
            "any_whitespace": any_whitespace,
            "max_whitespace_cnt": max_whitespace_cnt,
        }
        info = xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids or None
        )
        self.compiler = xgr.GrammarCompiler(info)  # caches compiled grammars by source

    def compile(self, spec: GrammarSpec) -> Any:
        xgr = self._xgr
        try:
            if spec.kind == "json_schema":
                if spec.value == ANY_JSON:
                    return self.compiler.compile_builtin_json_grammar()
                json.loads(spec.value)
                return self.compiler.compile_json_schema(spec.value, **self.json_whitespace)
            if spec.kind == "regex":
                return self.compiler.compile_regex(spec.value)
            if spec.kind == "ebnf":
                return self.compiler.compile_grammar(spec.value)
            if spec.kind == "tool_call":
                calls = [
                    xgr.Grammar.concat(
                        xgr.Grammar.from_regex(_literal_regex(prefix)),
                        xgr.Grammar.from_json_schema(schema, **self.json_whitespace),
                        xgr.Grammar.from_regex(_literal_regex(TOOL_CALL_SUFFIX)),
                    )
                    for prefix, schema in tool_call_pieces(json.loads(spec.value))
                ]
                grammar = calls[0] if len(calls) == 1 else xgr.Grammar.union(*calls)
                return self.compiler.compile_grammar(grammar)
        except (RuntimeError, ValueError, TypeError) as e:  # xgrammar's parse errors
            raise ValueError(f"Failed to compile {spec.kind} grammar: {e}") from None
        raise ValueError(f"unknown grammar kind {spec.kind!r}")


def _literal_regex(text: str) -> str:
    """A regex matching exactly ``text``."""
    special = set(".^$*+?{}[]\\|()/")
    return "".join("\\" + ch if ch in special else ("\\n" if ch == "\n" else ch) for ch in text)


_lock = threading.Lock()


def backend_for(holder: Any, tokenizer: Any, vocab_size: int, stop_ids: set[int]) -> GrammarBackend:
    """The server's one backend, built on first use and kept on ``holder.grammar_backend``
    (``holder.args`` carries SGLang's JSON whitespace flags)."""
    with _lock:
        if getattr(holder, "grammar_backend", None) is None:
            if tokenizer is None:
                raise ValueError(
                    "structured outputs need a tokenizer; the server runs with "
                    "--skip-tokenizer-init"
                )
            try:
                import xgrammar  # noqa: F401
            except ImportError:
                raise ValueError(
                    "structured outputs need xgrammar (make setup installs it)"
                ) from None
            args = holder.args
            holder.grammar_backend = GrammarBackend(
                tokenizer,
                vocab_size,
                sorted(stop_ids),
                any_whitespace=not args.constrained_json_disable_any_whitespace,
                max_whitespace_cnt=args.constrained_json_max_whitespace_cnt,
            )
        return holder.grammar_backend


def attach_constraints(
    holder: Any, tokenizer: Any, vocab_size: int, stop_ids: set[int], seqs: list[Any]
) -> None:
    """Compile each distinct grammar of ``seqs`` once and give every constrained sequence its
    own matcher (``seq.grammar``). Blocking (compilation): call it off the event loop."""
    specs = [s.params.grammar for s in seqs]
    if not any(specs):
        return
    backend = backend_for(holder, tokenizer, vocab_size, stop_ids)
    compiled: dict[GrammarSpec, Any] = {}
    for s, spec in zip(seqs, specs):
        if spec is None:
            continue
        if spec not in compiled:
            compiled[spec] = backend.compile(spec)
        s.grammar = Constraint(compiled[spec])
