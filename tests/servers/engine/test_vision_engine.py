"""The engine with image prompts in-process: a retraction (pause mode ``retract``) re-prefills
prompt + output with the images and their rope positions, so the sample goes on exactly as if
never interrupted, beside a text row in the same batch."""

from __future__ import annotations

import json
import threading
import time

import pytest

from servers.engine.engine import Engine
from servers.engine.model_runner import ModelRunner
from servers.engine.sequence import Sequence
from servers.protocol.images import load_image
from servers.protocol.request import SamplingParams


@pytest.fixture(scope="module")
def runner(tiny_vl_model_dir):
    return ModelRunner(str(tiny_vl_model_dir))


def _seq(rid, ids, vision):
    done = threading.Event()
    s = Sequence(rid=rid, prompt=list(ids), return_logprob=True,
                 params=SamplingParams(max_new_tokens=30, top_k=1, ignore_eos=True))
    s.vision = vision
    s.on_event = lambda q, n, final: done.set() if final else None
    return s, done


def test_retracted_image_rows_resume_to_the_same_greedy_output(runner, toy_vision_dir):
    from arealite.engine.vision_processor import load_processor

    row = json.loads((toy_vision_dir / "valid.jsonl").read_text().splitlines()[0])
    proc = load_processor(runner.model_path)
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": row["question"]}]}]
    text = proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    ids, vp = runner.vision.prepare(proc.tokenizer(text).input_ids, [load_image(row["images"][0])])
    eng = Engine(runner, weight_version="v0", random_seed=0)
    eng.start()
    try:
        ref, ref_done = _seq("ref", ids, vp)
        txt_ref, txt_ref_done = _seq("tref", ids[:5], None)
        for s in (ref, txt_ref):
            eng.submit(s)
        assert ref_done.wait(60) and txt_ref_done.wait(60)
        seq, done = _seq("x", ids, vp)
        txt, txt_done = _seq("t", ids[:5], None)
        for s in (seq, txt):
            eng.submit(s)
        deadline = time.time() + 60
        while len(seq.output_ids) < 8 and time.time() < deadline:
            time.sleep(0.002)
        eng.pause("retract").result(10)
        eng.resume().result(10)
        assert done.wait(60) and txt_done.wait(60)
    finally:
        eng.shutdown()
    assert seq.num_retractions == 1
    assert seq.output_ids == ref.output_ids and txt.output_ids == txt_ref.output_ids
    assert seq.output_logprobs == pytest.approx(ref.output_logprobs, abs=1e-5)
