"""Identical prompts admitted together are prefilled once (``servers.engine.shared_prefill``), and
every row then decodes as if it had been prefilled alone."""

from __future__ import annotations

import torch

from servers.engine.sequence import Sequence
from tests.servers.engine.test_server_engine import engine, make, runner, teacher_forced  # noqa: F401


def run_admitted_together(engine, runner, pairs) -> list[tuple[int, int]]:  # noqa: F811
    """Queue every sequence while the engine is paused, so one step admits them all, with the
    prompt's logprobs too (read from the shared forward); run them to the end and return the
    token shapes of every forward the runner ran."""
    for seq, _ in pairs:
        seq.logprob_start_len = 0
    shapes: list[tuple[int, int]] = []
    forward = runner.forward

    def record(r0, tokens, *args, **kw):
        shapes.append(tuple(tokens.shape))
        return forward(r0, tokens, *args, **kw)

    runner.forward = record
    try:
        engine.pause("in_place").result(5)
        for seq, _ in pairs:
            engine.submit(seq)
        engine.resume().result(5)
        for _, done in pairs:
            assert done.wait(30)
    finally:
        runner.forward = forward
    return shapes


def test_identical_prompts_share_one_prefill_and_decode_like_their_own(engine, runner):  # noqa: F811
    a, b = [7, 8, 9, 10, 11], [12, 13]
    pairs = [make(f"s{i}", p, max_new_tokens=12, temperature=1.0, ignore_eos=True)
             for i, p in enumerate([a, a, b, a, b])]
    shapes = run_admitted_together(engine, runner, pairs)
    # the first step's prefill: the two distinct prompts only, in rows 0 and 1; row 1 (b's
    # source) is also a's destination: every source is read before a row is written
    assert shapes[0] == (2, 5)
    seqs: list[Sequence] = [s for s, _ in pairs]
    assert len({tuple(s.output_ids) for s in seqs}) > 2  # sampled: the twins part ways
    for s in seqs:
        ref = teacher_forced(runner, s, 1.0)
        assert max(abs(x - y) for x, y in zip(ref, s.output_logprobs)) < 1e-5
    assert seqs[0].input_logprobs == seqs[1].input_logprobs == seqs[3].input_logprobs
    assert seqs[2].input_logprobs == seqs[4].input_logprobs and len(seqs[2].input_logprobs) == 2


def test_distinct_prompts_share_their_common_prefix_and_decode_like_their_own(engine, runner):  # noqa: F811
    """Distinct prompts behind the same 20 tokens (a system prompt): the prefix runs once, the
    suffixes from there, and every row's prompt and sampled logprobs are those of running it
    alone."""
    from servers.engine.shared_prefill import MIN_SHARED, shared_prefix_len

    system = [5 + (i * 7) % 40 for i in range(20)]
    tails = [[50, 51, 52], [60, 61], [50, 51, 53, 54], [70]]
    prompts = [system + t for t in tails] + [system + tails[1]]  # and one twin
    pairs = [make(f"p{i}", p, max_new_tokens=8, temperature=1.0, ignore_eos=True)
             for i, p in enumerate(prompts)]
    shapes = run_admitted_together(engine, runner, pairs)
    assert shared_prefix_len(prompts) == 20 >= MIN_SHARED
    assert shapes[:2] == [(1, 20), (4, 4)]  # the prefix once; 4 distinct suffixes (one twin)
    for seq, _ in pairs:
        ref = teacher_forced(runner, seq, 1.0)
        assert max(abs(x - y) for x, y in zip(ref, seq.output_logprobs)) < 1e-5
        ids = torch.tensor([seq.prompt])
        with torch.no_grad():
            lp = torch.log_softmax(runner.model(ids).logits[0].float(), -1)
        want = [lp[i, seq.prompt[i + 1]].item() for i in range(len(seq.prompt) - 1)]
        assert seq.input_logprobs[0] is None
        assert max(abs(x - y) for x, y in zip(want, seq.input_logprobs[1:])) < 1e-5


def test_shared_prefix_len_stops_short_of_the_last_token():
    from servers.engine.shared_prefill import shared_prefix_len

    assert shared_prefix_len([[1, 2, 3], [1, 2, 3]]) == 2  # identical: all but the last
    assert shared_prefix_len([[1, 2, 3, 4], [1, 2, 9], [1, 2, 3]]) == 2
    assert shared_prefix_len([[1, 2], [3, 4]]) == 0 and shared_prefix_len([[1, 2, 3]]) == 0
    assert shared_prefix_len([[1], [1, 2]]) == 0
