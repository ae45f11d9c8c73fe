"""The continuous-batching engine in-process: joins, logprob agreement, stops, pause modes."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from servers.engine.engine import Engine
from servers.engine.model_runner import ModelRunner
from servers.engine.sequence import Sequence
from servers.protocol.request import SamplingParams


@pytest.fixture(scope="module")
def runner(tiny_model_dir):
    return ModelRunner(str(tiny_model_dir))


@pytest.fixture()
def engine(runner):
    eng = Engine(runner, weight_version="v0", random_seed=0)
    eng.start()
    yield eng
    eng.shutdown()


def test_lean_forward_equals_decoder_forward(runner):
    from servers.engine.kv_cache import causal_slot_mask

    assert runner._lean
    tokens = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]])
    starts = torch.zeros(2, dtype=torch.long)
    with torch.inference_mode():
        runner._lean = False
        ref = runner.forward(0, tokens, starts)
        runner._lean = True
        positions = torch.arange(4).expand(2, 4)
        runner.cache.bind(0, 2, positions, 4)
        lean = runner._lean_forward(tokens, positions, causal_slot_mask(positions, 4))
    assert torch.equal(ref, lean)


def make(rid, prompt, **sp) -> tuple[Sequence, threading.Event]:
    done = threading.Event()
    seq = Sequence(rid=rid, prompt=prompt, params=SamplingParams(**sp), return_logprob=True)
    seq.on_event = lambda s, n, final: done.set() if final else None
    return seq, done


def run(engine, *pairs, timeout=30.0):
    for seq, _ in pairs:
        engine.submit(seq)
    for _, done in pairs:
        assert done.wait(timeout), "sequence did not finish"


def greedy(**kw):
    return dict(temperature=1.0, top_k=1, ignore_eos=True, **kw)


def teacher_forced(runner, seq: Sequence, temperature: float) -> list[float]:
    ids = torch.tensor([seq.prompt + seq.output_ids])
    with torch.no_grad():
        logits = runner.model(ids).logits[0].float()
    lp = torch.log_softmax(logits / temperature, -1)
    n = len(seq.prompt)
    return [lp[n - 1 + j, t].item() for j, t in enumerate(seq.output_ids)]


def test_late_request_joins_running_batch(engine):
    a, a_done = make("a", [5, 6, 7], max_new_tokens=60, **greedy())
    engine.submit(a)
    deadline = time.time() + 10
    while len(a.output_ids) < 5 and time.time() < deadline:
        time.sleep(0.001)
    b, b_done = make("b", [9, 10], max_new_tokens=6, **greedy())
    engine.submit(b)
    assert b_done.wait(20) and a_done.wait(20)
    # B was admitted while A decoded and finished long before A.
    assert b.finished_time < a.finished_time
    assert len(a.output_ids) == 60 and len(b.output_ids) == 6
    # Same greedy tokens as running each alone: batching did not change the maths.
    a2, a2_done = make("a2", [5, 6, 7], max_new_tokens=60, **greedy())
    b2, b2_done = make("b2", [9, 10], max_new_tokens=6, **greedy())
    run(engine, (a2, a2_done))
    run(engine, (b2, b2_done))
    assert a.output_ids == a2.output_ids and b.output_ids == b2.output_ids


def test_concurrent_requests_share_forward_passes(engine):
    pairs = [make(f"r{i}", [3 + i, 4, 5], max_new_tokens=20, **greedy()) for i in range(8)]
    before = engine.stats["forward_passes_total"]
    run(engine, *pairs)
    passes = engine.stats["forward_passes_total"] - before
    assert passes < 8 * 20 / 3, passes  # far fewer forwards than tokens


@pytest.mark.parametrize("temperature,extra", [(1.0, {}), (0.7, {"top_k": 20, "top_p": 0.9}),
                                               (1.3, {"min_p": 0.05})])
def test_sampled_logprobs_match_teacher_forcing(engine, runner, temperature, extra):
    pairs = [make(f"t{i}", [7, 8, 9, 10 + i], max_new_tokens=12 + 5 * i, temperature=temperature,
                  ignore_eos=True, **extra) for i in range(4)]
    run(engine, *pairs)
    for seq, _ in pairs:
        ref = teacher_forced(runner, seq, temperature)
        assert len(ref) == len(seq.output_logprobs)
        assert max(abs(a - b) for a, b in zip(ref, seq.output_logprobs)) < 1e-5


def test_greedy_logprobs_use_temperature_one(engine, runner):
    seq, done = make("g", [4, 5, 6], max_new_tokens=8, temperature=0.0 + 1.0, top_k=1)
    run(engine, (seq, done))
    assert seq.output_logprobs == pytest.approx(teacher_forced(runner, seq, 1.0), abs=1e-5)


def test_stop_token_is_kept_and_reported(engine, runner):
    probe, done = make("p", [11, 12], max_new_tokens=6, **greedy())
    run(engine, (probe, done))
    stop_tok = probe.output_ids[3]
    # stop_token_ids act only without ignore_eos (SGLang), so EOS may end the sample too
    first = next(i for i, t in enumerate(probe.output_ids)
                 if t == stop_tok or t in runner.eos_token_ids)
    seq, done = make("s", [11, 12], max_new_tokens=6, stop_token_ids={stop_tok},
                     **{**greedy(), "ignore_eos": False})
    run(engine, (seq, done))
    assert seq.output_ids == probe.output_ids[: first + 1]
    assert seq.finish == {"type": "stop", "matched": probe.output_ids[first]}


def test_stop_string_and_length(engine, runner):
    probe, done = make("p", [13, 14], max_new_tokens=10, **greedy())
    run(engine, (probe, done))
    assert probe.finish == {"type": "length", "length": 10}
    text = runner.tokenizer.decode(probe.output_ids[:4])
    stop = text[-2:] if len(text) >= 2 else text
    seq, done = make("s", [13, 14], max_new_tokens=10, stop=[stop], **greedy())
    run(engine, (seq, done))
    assert seq.finish == {"type": "stop", "matched": stop}
    assert stop in runner.tokenizer.decode(seq.output_ids)
    assert len(seq.output_ids) <= 4


def test_max_new_tokens_zero_and_min_new_tokens(engine, runner):
    z, done = make("z", [3, 4], max_new_tokens=0)
    run(engine, (z, done))
    assert z.output_ids == [] and z.finish == {"type": "length", "length": 0}
    eos = next(iter(runner.eos_token_ids))
    m, done = make("m", [3, 4], max_new_tokens=5, min_new_tokens=5, stop_token_ids={eos},
                   temperature=1.0, top_k=1)
    run(engine, (m, done))
    assert len(m.output_ids) == 5


def _until(pred, timeout=10.0):
    deadline = time.time() + timeout
    while not pred():
        assert time.time() < deadline, "condition not reached"
        time.sleep(0.002)


@pytest.mark.parametrize("mode", ["retract", "in_place"])
def test_pause_modes_resume_to_same_greedy_output(engine, mode):
    ref, ref_done = make("ref", [21, 22, 23], max_new_tokens=40, **greedy())
    run(engine, (ref, ref_done))
    seq, done = make("x", [21, 22, 23], max_new_tokens=40, **greedy())
    engine.submit(seq)
    _until(lambda: len(seq.output_ids) >= 10)
    engine.pause(mode).result(5)
    n = len(seq.output_ids)
    time.sleep(0.1)
    assert len(seq.output_ids) == n and not seq.finished  # nothing moves while paused
    engine.call(lambda: engine.set_weight_version("v1")).result(5)
    engine.resume().result(5)
    assert done.wait(20)
    assert seq.output_ids == ref.output_ids
    assert seq.spans == [{"version": "v0", "start": 0, "end": n},
                         {"version": "v1", "start": n, "end": 40}]
    assert seq.num_retractions == (1 if mode == "retract" else 0)
    engine.call(lambda: engine.set_weight_version("v0")).result(5)


def test_abort_by_rid_prefix_and_all(engine):
    a, a_done = make("job-1", [3], max_new_tokens=500, **greedy())
    b, b_done = make("job-2", [4], max_new_tokens=500, **greedy())
    c, c_done = make("other", [5], max_new_tokens=500, **greedy())
    for s in (a, b, c):
        engine.submit(s)
    _until(lambda: len(c.output_ids) > 2)
    assert engine.abort("job").result(5) == 0  # no live rid is exactly "job"
    assert engine.abort("job-1").result(5) == 1
    assert engine.abort("job-2").result(5) == 1
    assert a_done.wait(5) and b_done.wait(5) and not c.finished
    assert a.finish["type"] == "abort" and a.finish["message"] == "Aborted"
    engine.abort(abort_all=True).result(5)
    assert c_done.wait(5) and c.finish["type"] == "abort"
    assert engine.running == [] and not engine.waiting


def test_a_fault_no_single_request_causes_fails_nobody(engine, runner, monkeypatch):
    """A step that fails once (say, memory with the whole batch) is retried row by row: every
    request still finishes with the tokens it would have had."""
    pairs = [make(f"ref{i}", [3 + i, 4], max_new_tokens=5, **greedy()) for i in range(3)]
    run(engine, *pairs)
    real = runner.forward
    calls = {"n": 0}

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("boom")
        return real(*a, **k)

    monkeypatch.setattr(runner, "forward", flaky)
    again = [make(f"fa{i}", [3 + i, 4], max_new_tokens=5, **greedy()) for i in range(3)]
    run(engine, *again)
    assert calls["n"] > 2
    for (seq, _), (ref, _) in zip(again, pairs):
        assert seq.finish == {"type": "length", "length": 5}
        assert seq.output_ids == ref.output_ids and seq.output_logprobs == pytest.approx(
            ref.output_logprobs, abs=1e-5)


def test_a_request_that_faults_fails_alone(engine, runner, monkeypatch):
    """Only the request whose row breaks a step gets the 500; its batch-mates go on."""
    refs = [make(f"r{i}", [5 + i, 6, 7], max_new_tokens=12, **greedy()) for i in range(4)]
    run(engine, *refs)
    real = engine.next_token.adjust_logits

    def fragile(seqs, logits):
        if any(s.rid == "bad" and len(s.output_ids) >= 3 for s in seqs):
            raise IndexError("index 1000000 is out of bounds")
        return real(seqs, logits)

    monkeypatch.setattr(engine.next_token, "adjust_logits", fragile)
    good = [make(f"g{i}", [5 + i, 6, 7], max_new_tokens=12, **greedy()) for i in range(4)]
    bad = make("bad", [9, 9], max_new_tokens=12, **greedy())
    run(engine, *good[:2], bad, *good[2:])
    assert bad[0].finish["status_code"] == 500 and "out of bounds" in bad[0].finish["message"]
    assert len(bad[0].output_ids) == 3
    for (seq, _), (ref, _) in zip(good, refs):
        assert seq.finish == {"type": "length", "length": 12}
        assert seq.output_ids == ref.output_ids
    monkeypatch.undo()
    after, done = make("after", [5, 6, 7], max_new_tokens=12, **greedy())
    run(engine, (after, done))
    assert after.output_ids == refs[0][0].output_ids
