"""The embedded server's routed experts (SGLang's ``return_routed_experts``), in-process."""

from __future__ import annotations

import base64
import threading

import numpy as np
import pytest
import torch

from servers.engine.engine import Engine
from servers.engine.model_runner import ModelRunner
from servers.engine.routed_experts import SequenceRouting, moe_routers
from servers.engine.sequence import Sequence
from servers.protocol.request import SamplingParams
from servers.protocol.responses import Detokenizer, build_output
from servers.routes.generate import request_routing


@pytest.fixture(scope="module")
def runner(tiny_moe_dir):
    r = ModelRunner(str(tiny_moe_dir))
    r.enable_routed_experts()
    return r


def _run(engine: Engine, seqs: list[Sequence], timeout: float = 60.0) -> None:
    events = []
    for s in seqs:
        ev = threading.Event()
        s.on_event = lambda _s, _n, final, ev=ev: ev.set() if final else None
        events.append(ev)
        engine.submit(s)
    for ev in events:
        assert ev.wait(timeout), "sequence did not finish"


def _decode(meta: dict, layers: int, k: int) -> np.ndarray:
    return np.frombuffer(base64.b64decode(meta["routed_experts"]), dtype="<i4").reshape(
        -1, layers, k
    )


def _reference(runner: ModelRunner, ids: list[int]) -> np.ndarray:
    """Expert ids of one plain HF forward over ``ids``, [len, layers, k]."""
    routers = moe_routers(runner.decoder)
    got: dict[int, torch.Tensor] = {}
    hooks = [
        r.register_forward_hook(lambda m, a, o, i=i: got.__setitem__(i, o[2]))
        for i, r in routers.items()
    ]
    try:
        with torch.no_grad():
            runner.model(torch.tensor([ids]))
    finally:
        for h in hooks:
            h.remove()
    return torch.stack([got[i] for i in sorted(got)], 1).numpy()


def test_each_token_reports_the_experts_a_plain_forward_picks(runner):
    engine = Engine(runner, weight_version="0", random_seed=0)
    engine.start()
    try:
        k, layers = runner.routed.top_k, runner.num_hidden_layers
        prompts = [[5, 6, 7, 8, 9], [11, 12, 13], [5, 6, 7, 8, 9]]  # a duplicate: shared prefill
        seqs = [
            Sequence(
                rid=f"r{i}",
                prompt=p,
                params=SamplingParams(max_new_tokens=6, ignore_eos=True),
                return_logprob=True,
                routing=SequenceRouting(layers, k),
            )
            for i, p in enumerate(prompts)
        ]
        plain = Sequence(rid="plain", prompt=[3, 4], params=SamplingParams(max_new_tokens=3))
        _run(engine, [*seqs, plain])
        detok = Detokenizer(runner.tokenizer)
        agree = total = 0
        for s in seqs:
            meta = build_output(s, len(s.output_ids), True, detok, "0")["meta_info"]
            rows = _decode(meta, layers, k)
            assert rows.shape == (len(s.prompt) + len(s.output_ids) - 1, layers, k)
            assert meta["routed_experts_start_len"] == 0
            ref = _reference(runner, s.prompt + s.output_ids[:-1])
            same = (np.sort(rows, -1) == np.sort(ref, -1)).all(-1)
            agree, total = agree + int(same.sum()), total + same.size
        assert agree / total >= 0.98, f"{agree}/{total} token-layers agree with a plain forward"
        assert "routed_experts" not in build_output(plain, 3, True, detok, "0")["meta_info"]
    finally:
        engine.shutdown()


def test_start_len_and_bad_requests(runner, tiny_model_dir):
    rt = request_routing(
        runner, {"return_routed_experts": True, "routed_experts_start_len": 2}, [[1, 2, 3]]
    )[0]
    rt.write(0, torch.arange(2 * 4 * 2, dtype=torch.int32).view(4, 2, 2))
    assert rt.rows(4).shape == (2, 2, 2) and rt.rows(4)[0, 0, 0] == 8
    # a re-prefill (after a retract) covers positions 0..4 again: the rows first written stay,
    # only position 4 is new
    rt.write(0, torch.full((5, 2, 2), 99, dtype=torch.int32))
    assert rt.rows(5)[:, 0, 0].tolist() == [8, 12, 99]
    with pytest.raises(ValueError, match=r"routed_experts_start_len must be in \[0, 3\]"):
        request_routing(
            runner, {"return_routed_experts": True, "routed_experts_start_len": 4}, [[1, 2, 3]]
        )
    assert request_routing(runner, {}, [[1]]) == [None]
    dense = ModelRunner(str(tiny_model_dir))
    with pytest.raises(ValueError, match="--enable-return-routed-experts"):
        request_routing(dense, {"return_routed_experts": True}, [[1]])
    with pytest.raises(ValueError, match="no mixture-of-experts layer"):
        dense.enable_routed_experts()
