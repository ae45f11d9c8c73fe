"""The grammar mask (servers/engine/grammar.py) against a slow reference loop, and the
compiler's kinds, on the tiny tokenizer."""

from __future__ import annotations

import json
import re

import pytest
import torch

from servers.protocol.request import GrammarSpec

xgr = pytest.importorskip("xgrammar")

from servers.engine.grammar import (  # noqa: E402
    Constraint,
    GrammarBackend,
    GrammarStep,
    _literal_regex,
)


@pytest.fixture(scope="module")
def backend(tiny_tokenizer):
    return GrammarBackend(tiny_tokenizer, len(tiny_tokenizer), [tiny_tokenizer.eos_token_id])


def test_mask_matches_a_reference_loop_and_leaves_other_rows(backend, tiny_tokenizer):
    """Rows 1 and 3 constrained (row 3 one token in), rows 0 and 2 not, on logits wider than
    the grammar's vocabulary (padding columns are left alone)."""
    from types import SimpleNamespace

    spec = GrammarSpec("regex", "[0-9]{2}")
    cons = [Constraint(backend.compile(spec)) for _ in range(2)]
    assert cons[1].matcher.accept_token(tiny_tokenizer.encode("7", add_special_tokens=False)[0])
    rows = [SimpleNamespace(grammar=g, finished=False) for g in (None, cons[0], None, cons[1])]
    vocab = len(tiny_tokenizer)
    logits = torch.randn(4, vocab + 3, generator=torch.Generator().manual_seed(0))
    before = logits.clone()
    GrammarStep().mask(logits, rows)
    assert torch.equal(logits[0], before[0]) and torch.equal(logits[2], before[2])
    assert torch.equal(logits[:, vocab:], before[:, vocab:])
    for row, c in ((1, cons[0]), (3, cons[1])):
        mask = xgr.allocate_token_bitmask(1, vocab)
        c.matcher.fill_next_token_bitmask(mask, 0)
        for t in range(vocab):  # slow reference: bit t of the packed mask
            allowed = bool((int(mask[0, t // 32]) >> (t % 32)) & 1)
            want = before[row, t].item() if allowed else float("-inf")
            assert logits[row, t].item() == want
    digits = [t for t in range(vocab) if re.fullmatch("[0-9]", tiny_tokenizer.decode([t]))]
    allowed = torch.isfinite(logits[1, :vocab]).nonzero().view(-1).tolist()
    assert set(allowed) <= set(digits) and allowed


def test_kinds_compile_and_bad_ones_are_value_errors(backend):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
    for spec in (
        GrammarSpec("json_schema", json.dumps(schema)),
        GrammarSpec("json_schema", "$$ANY$$"),
        GrammarSpec("ebnf", 'root ::= "a" | "b"'),
        GrammarSpec("tool_call", json.dumps(tools)),
    ):
        assert backend.compile(spec) is not None
    for spec, frag in (
        (GrammarSpec("regex", "("), "regex"),
        (GrammarSpec("ebnf", "root ::="), "ebnf"),
        (GrammarSpec("json_schema", "{"), "json_schema"),
    ):
        with pytest.raises(ValueError, match=f"Failed to compile {frag}"):
            backend.compile(spec)


def test_literal_regex_matches_exactly_its_text():
    for text in ('<tool_call>\n{"name": ', "}\n</tool_call>", "a.b*c(d)|e[f]?+^$\\/"):
        assert re.fullmatch(_literal_regex(text), text)
        assert not re.fullmatch(_literal_regex(text), text + "x")


def test_grammar_step_masks_live_rows_feeds_tokens_and_reports_rejections(backend, tiny_tokenizer):
    """The engine's per-step grammar work (``GrammarStep``): masks only rows with a live grammar,
    feeds sampled tokens to the matchers, returns a row whose token the matcher refused (at
    once) and masks it no more, and ends a grammar on a sampled stop token."""
    from types import SimpleNamespace

    enc = lambda s: tiny_tokenizer.encode(s, add_special_tokens=False)[0]  # noqa: E731
    eos = tiny_tokenizer.eos_token_id
    compiled = backend.compile(GrammarSpec("regex", "[0-9]"))
    rows = [SimpleNamespace(grammar=Constraint(compiled), finished=False) for _ in range(3)]
    rows.insert(1, SimpleNamespace(grammar=None, finished=False))  # an unconstrained row
    step = GrammarStep()
    logits = torch.zeros(4, len(tiny_tokenizer))
    step.mask(logits, rows)
    assert torch.isfinite(logits[1]).all() and not torch.isfinite(logits[0]).all()
    assert torch.isfinite(logits[0, enc("7")]) and not torch.isfinite(logits[0, eos])
    # row 0 samples a digit, row 2 a letter the grammar refuses
    assert step.sampled(rows, [enc("7"), enc("x"), enc("x"), enc("3")]) == [rows[2]]
    logits = torch.zeros(4, len(tiny_tokenizer))
    step.mask(logits, rows)  # row 2 is rejected: not masked
    assert rows[2].grammar.rejected and torch.isfinite(logits[2]).all()
    assert torch.isfinite(logits[0, eos]) and not torch.isfinite(logits[0, enc("7")])
    assert step.sampled(rows, [eos, 0, 0, eos]) == []
    assert rows[0].grammar.ended and rows[3].grammar.ended
