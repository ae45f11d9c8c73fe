"""Real-client conformance: AReaL's own ``RemoteSGLangEngine`` (the ``areal`` wheel, in its own
virtualenv ``.venv-areal`` that ``make test`` builds) drives two embedded servers.

``areal_driver.py`` runs AReaL's client against the servers and records what it got back; the
checks here recompute every token with a teacher-forced forward in this process. Where AReaL
itself departs from SGLang, the test pins down AReaL's behaviour and the SGLang 0.5.23 source
that decides it, and checks that our server does what SGLang does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import requests
import torch

from tests.support.procs import embedded_server, kill_group
from tests.support.sampling_reference import TOL, check_against_own_settings

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
AREAL_PYTHON = Path(os.environ.get("AREAL_PYTHON", REPO / ".venv-areal" / "bin" / "python"))
DRIVER = Path(__file__).resolve().parents[1] / "support" / "areal_driver.py"
SERVER_ARGS = ["--max-running-requests", "4", "--random-seed", "0"]  # 12 requests: some queue


def perturbed_copy(src: Path, dst: Path) -> Path:
    """The same model with other weights: a checkpoint to load from disk mid-run."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    model.save_pretrained(str(dst))
    for f in src.iterdir():
        if f.name.startswith("tokenizer") or f.suffix == ".jinja":
            shutil.copy(f, dst / f.name)
    return dst


@pytest.fixture(scope="module")
def run(tiny_model_dir, tmp_path_factory):
    if not AREAL_PYTHON.exists():
        pytest.skip(f"{AREAL_PYTHON} missing: `make setup-areal` builds AReaL's virtualenv")
    from transformers import AutoModelForCausalLM

    tmp = tmp_path_factory.mktemp("areal")
    new_model = perturbed_copy(Path(tiny_model_dir), tmp / "new_model")
    old = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    new = AutoModelForCausalLM.from_pretrained(str(new_model), dtype=torch.float32)
    with embedded_server(str(tiny_model_dir), SERVER_ARGS) as a, \
            embedded_server(str(tiny_model_dir), SERVER_ARGS) as b:
        spec = {"addrs": [a, b], "new_model": str(new_model), "tokenizer": str(tiny_model_dir),
                "name_root": str(tmp / "name_resolve"), "vocab": old.config.vocab_size,
                "eos": [int(old.generation_config.eos_token_id)]}
        (tmp / "spec.json").write_text(json.dumps(spec))
        proc = subprocess.Popen(
            [str(AREAL_PYTHON), str(DRIVER), str(tmp / "spec.json"), str(tmp / "out.json")],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp,
            env={**os.environ, "PYTHONPATH": ""},
        )
        try:
            log, _ = proc.communicate(timeout=420)
        finally:
            kill_group(proc)
        assert proc.returncode == 0, log.decode(errors="replace")[-4000:]
        out = json.loads((tmp / "out.json").read_text())
        health = [requests.get(f"http://{x}/health", timeout=10).status_code for x in (a, b)]
        # what SGLang's own rule gives for the score request AReaL's compute_logp sends
        body = {"input_ids": [3, 4, 5, 6, 7, 8], "return_logprob": True, "logprob_start_len": 2,
                "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}
        out["_score_meta"] = requests.post(f"http://{a}/generate", json=body, timeout=60).json()[
            "meta_info"]
    out["_health_after"] = health
    out["_spec"] = spec
    return out, old, new


def step(out: dict, name: str):
    assert name not in out["errors"], f"AReaL's client failed in {name}:\n{out['errors'][name]}"
    return out[name]


def greedy_continuation(model, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(n):
            ids = torch.cat([ids, model(ids).logits[0, -1].argmax().view(1, 1)], 1)
    return ids[0, len(prompt):].tolist()


def test_greedy_after_sampled_requests_stays_greedy(run):
    out, old, _ = run
    recs = step(out, "greedy_after_sampled")
    want = greedy_continuation(old, recs[0]["prompt"], 8)
    for rec in recs:  # one request at a time, each right after a temperature-2 request
        assert rec["output_ids"] == want, rec["rid"]
        check_against_own_settings(old, rec)


def test_mixed_settings_each_served_with_its_own(run):
    out, old, _ = run
    recs = step(out, "mixed")
    assert len(recs) == 40
    assert {r["sp"]["temperature"] for r in recs} == {0.0, 0.5, 0.8, 1.3, 2.0}
    for rec in recs:
        assert rec["stop_reason"] == "length" and all(v == 0 for v in rec["versions"])
        check_against_own_settings(old, rec)


def test_stop_token_ids_stop_and_ignore_eos_turns_them_off(run):
    out, old, _ = run
    res = step(out, "stops")
    probe, stop = res["probe"], res["stop_token"]
    assert probe == greedy_continuation(old, [4, 9, 2, 8], 12)
    stopped = res["stop_token_ids"]
    assert stopped["output_ids"] == probe[: probe.index(stop) + 1]
    assert stopped["stop_reason"] == "stop"
    # AReaL's RLVR sends EOS and pad as stop ids; with ignore_eos SGLang stops on none of them.
    ignored = res["ignore_eos"]
    assert stop in ignored["sp"]["stop_token_ids"] and ignored["sp"]["ignore_eos"] is True
    assert ignored["output_ids"] == probe and ignored["stop_reason"] == "length"


def test_stop_string(run):
    out, _, _ = run
    res = step(out, "stop_string")
    got = res["result"]
    assert got["stop_reason"] == "stop" and len(got["output_ids"]) < len(res["probe"])
    assert got["output_ids"] == res["probe"][: len(got["output_ids"])]
    assert res["stop"] in res["probe_text"]


def test_max_new_tokens_past_the_context_is_an_error_not_a_clip(run):
    res = step(run[0], "context_error")
    assert res["raised"], "a request for 16384 new tokens on a 512-token model was answered"
    assert "400" in res["message"]


def test_pause_abort_and_continue_with_running_and_queued_requests(run):
    out, old, _ = run
    res = step(out, "interruption")
    # 12 requests on 2 servers that run 4 each: 8 ran and 4 waited when the pause aborted them.
    assert res["aborted"] >= 12
    for rec, ref in zip(res["interrupted"], res["reference"]):
        assert rec["output_ids"] == ref and len(ref) == 150
        assert rec["stop_reason"] == "length"
    check_against_own_settings(old, res["interrupted"][0])


def test_disk_update_in_the_middle_of_generation(run):
    out, old, new = run
    res = step(out, "disk_update")
    assert res["weight_updates_total"] == [1, 1]
    for rec in res["results"]:
        versions, toks = rec["versions"], rec["output_ids"]
        assert len(toks) == 120 and versions[0] == 0 and versions[-1] == 1
        assert versions == sorted(versions)
        with torch.no_grad():
            full = torch.tensor([rec["prompt"] + toks])
            lp_old = torch.log_softmax(old(full).logits[0], -1)
            lp_new = torch.log_softmax(new(full).logits[0], -1)
        for j, (tok, v) in enumerate(zip(toks, versions)):
            lp = (lp_old if v == 0 else lp_new)[len(rec["prompt"]) - 1 + j]
            assert lp[tok].item() >= lp.max().item() - TOL, (rec["rid"], j, v)
            assert abs(lp[tok].item() - rec["logprobs"][j]) < TOL, (rec["rid"], j, v)


def test_offload_and_onload(run):
    out, _, new = run
    res = step(out, "offload")
    assert res["released"] == [["cuda_graph", "kv_cache", "weights"]] * 2
    assert res["resumed"] == [[], []]
    after = res["after"]
    assert after["output_ids"] == greedy_continuation(new, after["prompt"], 10)
    check_against_own_settings(new, after)
    assert out["_health_after"] == [200, 200]


def test_rlvr_workflow_trajectories(run):
    out, old, _ = run
    trajs = step(out, "rlvr")
    assert len(trajs) == 4
    for t in trajs:
        for ids, mask, lps, vers in zip(t["input_ids"], t["loss_mask"], t["logprobs"], t["versions"]):
            with torch.no_grad():
                lp = torch.log_softmax(old(torch.tensor([ids])).logits[0], -1)
            gen = [i for i, m in enumerate(mask) if m]
            assert gen, "no generated token"
            for i in gen:
                assert abs(lp[i - 1, ids[i]].item() - lps[i]) < TOL
                assert vers[i] == 0
        assert all(r in (0.0, 1.0) for r in t["rewards"])


def test_areal_deviation_input_logprobs_first_entry(run):
    """AReaL 1.0.4's ``SGLangBackend.parse_score_response`` calls ``float(x[0])`` on every
    ``input_token_logprobs`` entry, but SGLang puts ``None`` first:
    ``sglang/srt/managers/scheduler_components/logprob_result_processor.py``,
    ``req.logprob.input_token_logprobs_val = [None] + input_token_logprobs[:-1]``. So AReaL's
    ``compute_logp`` raises on a real SGLang server; ours answers as SGLang does."""
    out, _, _ = run
    res = step(out, "compute_logp")
    assert res["raised"] and res["type"] == "TypeError" and "NoneType" in res["message"]
    meta = out["_score_meta"]
    assert meta["input_token_logprobs"][0][0] is None
    assert len(meta["input_token_logprobs"]) == 4


def test_areal_deviation_distributed_update_without_begin(run):
    """AReaL 1.0.4 posts ``/update_weights_from_distributed`` without ``/begin_weight_update``.
    SGLang 0.5.23 refuses that before joining any broadcast:
    ``sglang/srt/managers/scheduler_components/weight_updater.py``,
    ``update_weights_from_distributed``: ``if self._session is None: return ...(success=False,
    message="update_weights_from_distributed must run between begin_weight_update() and
    end_weight_update()")``. Ours answers the same, at once, and keeps serving."""
    out, _, _ = run
    answers = step(out, "distributed_without_begin")
    assert len(answers) == 2
    for ans in answers:
        assert ans["status"] == 400 and ans["body"]["success"] is False
        assert ans["body"]["message"] == ("update_weights_from_distributed must run between "
                                          "begin_weight_update() and end_weight_update()")
        assert ans["seconds"] < 10  # refused without waiting in a broadcast
    assert out["_health_after"] == [200, 200]


def test_driver_imports_nothing_of_this_project():
    """The two virtualenvs meet only over HTTP: the driver never imports arealite or servers."""
    src = DRIVER.read_text()
    assert "import arealite" not in src and "from arealite" not in src
    assert "from servers" not in src and "import servers" not in src
