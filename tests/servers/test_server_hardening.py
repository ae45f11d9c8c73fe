"""One bad request never hurts another, and a stuck engine is seen from outside (HTTP)."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.support.http_calls import post

pytestmark = pytest.mark.integration



@pytest.mark.parametrize("sp,fragment", [
    ({"stop_token_ids": [1000000], "min_new_tokens": 2}, "stop_token_ids must hold token ids"),
    ({"stop_token_ids": [2**63], "min_new_tokens": 2}, "stop_token_ids must hold token ids"),
    ({"logit_bias": {"5": float("nan")}}, "logit_bias values must be finite"),
    ({"logit_bias": {"5": float("inf")}}, "logit_bias values must be finite"),
    ({"stop_regex": "(?<=a)b"}, "not a valid RE2 pattern"),
])
def test_bad_sampling_params_are_400_and_the_batch_goes_on(server, sp, fragment):
    good = {"input_ids": [3, 4, 5], "sampling_params": {"max_new_tokens": 40, "ignore_eos": True}}
    with ThreadPoolExecutor(16) as pool:
        futs = [pool.submit(post, server, "/generate", good) for _ in range(16)]
        time.sleep(0.05)
        # requests' json= refuses NaN/inf: send the raw text a client in another language sends
        import json
        bad = post(server, "/generate", data=json.dumps(
            {"input_ids": [3, 4], "sampling_params": {"max_new_tokens": 4, **sp}}),
            headers={"Content-Type": "application/json"})
        answers = [f.result() for f in futs]
    assert bad.status_code == 400, bad.text
    assert fragment in bad.json()["error"]["message"]
    assert [a.status_code for a in answers] == [200] * 16
    assert all(len(a.json()["output_ids"]) == 40 for a in answers)


def test_a_backtracking_stop_regex_cannot_stall_the_engine(server):
    """``^(a|aa)+b$`` takes Python's ``re`` exponential time on a run of a's; stop regexes run
    on RE2 (linear), so the request and its neighbours finish as usual."""
    t0 = time.monotonic()
    out = post(server, "/generate", {"text": "a" * 30, "sampling_params": {
        "max_new_tokens": 30, "stop_regex": ["^(a|aa)+b$", "(x+x+)+y"], "ignore_eos": True}})
    assert out.status_code == 200 and time.monotonic() - t0 < 30
    assert requests.get(f"{server}/health_generate", timeout=30).status_code == 200


def test_health_reports_a_stuck_engine(tiny_model_dir, tmp_path):
    """A step that never comes back (here: a weight load blocked reading a pipe) makes /health
    answer 503, so clients take the server out of rotation; it is 200 again once it ends."""
    from tests.support.procs import embedded_server

    stuck = tmp_path / "stuck"
    stuck.mkdir()
    fifo = stuck / "pytorch_model.bin"  # read by torch.load, which lets go of the GIL
    os.mkfifo(fifo)
    args = ["--health-stall-timeout", "1.5", "--random-seed", "0"]
    with embedded_server(str(tiny_model_dir), args) as addr:
        server = f"http://{addr}"
        assert requests.get(f"{server}/health", timeout=10).status_code == 200
        box: dict = {}
        t = threading.Thread(target=lambda: box.update(r=post(
            server, "/update_weights_from_disk", {"model_path": str(stuck)})))
        t.start()
        deadline = time.monotonic() + 30
        while requests.get(f"{server}/health", timeout=10).status_code == 200:
            assert time.monotonic() < deadline, "/health never noticed the stuck engine"
            time.sleep(0.2)
        with open(fifo, "wb"):  # let the blocked reader go: it reads nothing and fails
            pass
        t.join(60)
        assert box["r"].status_code == 400 and box["r"].json()["success"] is False
        deadline = time.monotonic() + 30
        while requests.get(f"{server}/health", timeout=10).status_code != 200:
            assert time.monotonic() < deadline, "/health stayed 503 after the engine recovered"
            time.sleep(0.2)
        ok = post(server, "/generate", {"input_ids": [3, 4], "sampling_params": {"max_new_tokens": 2}})
        assert ok.status_code == 200


def test_disk_loads_only_from_allowed_folders(tiny_model_dir, tmp_path):
    """/update_weights_from_disk reads only under the folder holding --model-path and each
    --weight-load-root; ``..`` and symlinks that lead out are refused and the weights stay."""
    import shutil

    from tests.support.procs import embedded_server

    model = tmp_path / "models" / "tiny"  # the server may read under tmp_path/models
    allowed = tmp_path / "run"
    outside = tmp_path / "elsewhere"
    for d in (model, allowed / "ckpt", outside):
        d.mkdir(parents=True)
        for f in tiny_model_dir.iterdir():
            shutil.copy(f, d / f.name)
    (allowed / "link").symlink_to(outside, target_is_directory=True)
    args = ["--weight-load-root", str(allowed), "--random-seed", "0"]
    with embedded_server(str(model), args) as addr:
        server = f"http://{addr}"
        greedy = {"input_ids": [3, 4], "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
        before = post(server, "/generate", greedy).json()["output_ids"]
        for bad in (outside, allowed / "link", allowed / ".." / "elsewhere", "/etc"):
            r = post(server, "/update_weights_from_disk", {"model_path": str(bad)})
            assert r.status_code == 400 and "outside the folders" in r.json()["message"], bad
        assert post(server, "/generate", greedy).json()["output_ids"] == before
        ok = post(server, "/update_weights_from_disk", {"model_path": str(allowed / "ckpt")})
        assert ok.status_code == 200 and ok.json()["success"], ok.text
        home = post(server, "/update_weights_from_disk", {"model_path": str(model)})
        assert home.status_code == 200  # the folder holding the model is always allowed
