"""Structured outputs: grammar constraints enforced token by token, with xgrammar (SGLang's
default grammar backend).

A constrained sequence carries a ``Constraint`` (one xgrammar matcher). Each engine step, the
rows that carry one get their grammar's bitmask applied to their logits (every token outside it
-inf) before sampling; rows without a constraint are not touched and no work is done when no
row has one. ``GrammarStep`` is that per-step work, the engine's only grammar call sites: as in
SGLang, one bitmask buffer for the batch, filled row by row by the matchers and applied by
xgrammar's kernel, and the sampled tokens fed to the matchers after sampling. A sampled stop
token ends the grammar and the sequence (the mask allows one only where the grammar may end),
as SGLang's ``Req.check_finished``.

Logprob convention (SGLang's): the mask is applied to the logits in place with the penalties
and the logit bias (``SamplingBatchInfo.apply_logits_bias`` in SGLang's ``ModelRunner.sample``)
and the sampler takes ``log_softmax(logits / T)`` of those masked logits, so the log-prob
reported for a constrained token is in the grammar-restricted distribution (renormalised over
the allowed tokens). The trainer recomputes over the full vocabulary: masks are not replayed
(docs/servers.md, structured outputs).

The compiler is built once per server, on the first constrained request (building the
tokenizer table takes a moment), and caches compiled grammars, so the same schema compiles
once.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import torch

from servers.protocol.request import ANY_JSON, GrammarSpec


class Constraint:
    """One sequence's grammar state (an xgrammar ``GrammarMatcher``); the engine thread reads
    ``ended`` / ``rejected`` and ``GrammarStep`` drives the matcher."""

    def __init__(self, compiled: Any) -> None:
        import xgrammar as xgr

        self.matcher = xgr.GrammarMatcher(compiled)
        self.vocab_size = int(compiled.tokenizer_info.vocab_size)
        self.stop_ids = frozenset(int(t) for t in self.matcher.stop_token_ids)
        self.ended = False  # a stop token was sampled: the grammar is complete (SGLang: terminated)
        self.rejected = False  # the matcher refused a sampled token (every allowed one was banned)


class GrammarStep:
    """An engine's per-step grammar work, SGLang's scheme on one thread: ``mask`` before
    sampling fills the bitmask rows of the rows with a live grammar (one batched xgrammar call
    into a buffer kept across steps) and applies them to those rows only, in place (xgrammar's
    kernel); ``sampled`` after it feeds each constrained row's token to its matcher, ends a
    grammar on a sampled stop token and reports the rows whose token the matcher refused. Rows
    are objects with ``.grammar`` (a ``Constraint`` or None) and ``.finished``. Unconstrained
    rows are never touched, and a batch without a live grammar does no work.

    Why no worker thread (SGLang fills the next batch's masks while the GPU runs the forward):
    on CPU the forward holds the cores, and accept + fill cost ~1-2 us per row, less than
    handing them to a thread (benchmarks/micro/server_throughput --mixed-constrained)."""

    def __init__(self) -> None:
        self._bits: torch.Tensor | None = None  # int32 [rows, ceil(vocab / 32)], reused
        self._backend = ""  # xgrammar's apply kernel for the logits' device, chosen on first use
        self._filler: Any = None  # xgrammar's BatchGrammarMatcher, built on first use

    def mask(self, logits: torch.Tensor, seqs: list[Any]) -> None:
        """Set every token a live grammar forbids to -inf in its row, in place; other rows and
        the logits' columns past the grammar's vocabulary (padding) stay as they are."""
        rows = [
            i
            for i, s in enumerate(seqs)
            if s.grammar is not None and not (s.grammar.ended or s.grammar.rejected)
        ]
        if not rows:
            return
        import xgrammar as xgr

        vocab = seqs[rows[0]].grammar.vocab_size
        bits = self._buffer(len(seqs), vocab)
        if self._filler is None:  # one fill thread: a row's fill is ~1-3 us (the engine's core)
            self._filler = xgr.BatchGrammarMatcher(1)
        self._filler.batch_fill_next_token_bitmask(
            [seqs[i].grammar.matcher for i in rows], bits, rows
        )
        if logits.device.type != "cpu":
            bits = bits.to(logits.device, non_blocking=True)
        xgr.apply_token_bitmask_inplace(
            logits,
            bits,
            vocab_size=min(vocab, logits.shape[-1]),
            indices=rows,
            backend=self._kernel(logits),
        )

    def sampled(self, seqs: list[Any], tokens: list[int]) -> list[Any]:
        """Feed each constrained row's sampled token to its matcher; returns the rows whose
        token the matcher refused (they end with an error, before the token is kept). One
        ``accept_token`` per row: xgrammar's batch accept costs more here (its result list is
        read element by element through the FFI)."""
        rejected = []
        for s, tok in zip(seqs, tokens):
            g = s.grammar
            if g is None or g.ended or g.rejected or s.finished:
                continue
            if tok in g.stop_ids:  # the mask allows a stop token only where the grammar may end
                g.ended = True
            elif not g.matcher.accept_token(tok):  # only when every allowed token was banned
                g.rejected = True  # (min_new_tokens)
                rejected.append(s)
        return rejected

    def _buffer(self, rows: int, vocab: int) -> torch.Tensor:
        """The bitmask buffer, grown (never shrunk) to ``rows``; a row is rewritten before use."""
        import xgrammar as xgr

        width = xgr.get_bitmask_shape(1, vocab)[1]
        cap = 0 if self._bits is None else self._bits.shape[0]
        if cap < rows or self._bits.shape[1] != width:
            self._bits = xgr.allocate_token_bitmask(max(rows, 2 * cap), vocab)
        return self._bits

    def _kernel(self, logits: torch.Tensor) -> str:
        if not self._backend:
            import importlib.util

            cpu = logits.device.type == "cpu"
            gpu = logits.device.type == "cuda" and importlib.util.find_spec("triton") is not None
            self._backend = "cpu" if cpu else ("auto" if gpu else "torch_native")
        return self._backend


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
