"""The pool launcher and the REST control gateway, as separate processes."""

from __future__ import annotations

import importlib.util
import sys
import time

import pytest
import requests

from servers.net import find_free_port, http_ok, wait_healthy

pytestmark = pytest.mark.integration


def _read_addrs(proc, log_path, timeout=120.0) -> list[str]:
    from tests.support.procs import log_tail

    deadline = time.time() + timeout
    while time.time() < deadline:
        with open(log_path) as f:
            for line in f:
                if line.startswith("AREAL_LLM_SERVER_ADDRS="):
                    return line.strip().split("=", 1)[1].split(",")
        assert proc.poll() is None, log_tail(log_path)
        time.sleep(0.2)
    raise AssertionError(f"pool never printed its addresses:\n{log_tail(log_path)}")


def _requests_served(addr: str) -> int:
    info = requests.get(f"http://{addr}/server_info", timeout=10).json()
    return int(info["internal_states"][0]["num_requests_total"])


def test_pool_and_gateway(tiny_model_dir, tmp_path):
    from tests.support.procs import log_tail, spawn

    pool_cmd = [sys.executable, "-m", "servers.launch_pool", "--n", "2", "--model-path",
                str(tiny_model_dir), "--log-dir", str(tmp_path / "logs"), "--random-seed", "0"]
    with spawn(pool_cmd) as (pool, pool_log):
        addrs = _read_addrs(pool, pool_log)
        assert len(addrs) == 2 and all(http_ok(f"http://{a}/health") for a in addrs)
        port = find_free_port()
        gw_cmd = [sys.executable, "-m", "servers.gateway", "--servers", ",".join(addrs),
                  "--port", str(port), "--health-check-interval", "0.5"]
        with spawn(gw_cmd) as (gw, gw_log):
            base = f"http://127.0.0.1:{port}"
            assert wait_healthy(f"{base}/health", 60, alive=lambda: gw.poll() is None), log_tail(gw_log)
            assert requests.get(f"{base}/health", timeout=5).json() == {"healthy": 2, "total": 2}

            before = [_requests_served(a) for a in addrs]
            body = {"input_ids": [3, 4], "sampling_params": {"max_new_tokens": 3}}
            for _ in range(4):
                r = requests.post(f"{base}/generate", json=body, timeout=30)
                assert r.status_code == 200 and len(r.json()["output_ids"]) >= 1
            assert [_requests_served(a) - b for a, b in zip(addrs, before)] == [2, 2]  # round robin
            stream = requests.post(f"{base}/generate", json={**body, "stream": True}, timeout=30)
            assert stream.text.rstrip().endswith("data: [DONE]")
            bad = requests.post(f"{base}/generate", json={"input_ids": []}, timeout=30)
            assert bad.status_code == 400  # the server's own error passes through

            # One curl moves the whole pool: fan-out with a per-server result.
            r = requests.post(f"{base}/update_weights_from_disk", timeout=60,
                              json={"model_path": str(tiny_model_dir), "weight_version": "4"})
            assert r.status_code == 200, r.text
            out = r.json()
            assert out["success"] is True and set(out["results"]) == {f"http://{a}" for a in addrs}
            for a in addrs:
                assert requests.get(f"http://{a}/model_info", timeout=5).json()["weight_version"] == "4"
            r = requests.post(f"{base}/update_weights_from_disk", json={"model_path": "/nope"}, timeout=60)
            assert r.status_code == 400 and r.json()["success"] is False
            for path, payload in (("/pause_generation", {"mode": "in_place"}),
                                  ("/continue_generation", {}),
                                  ("/update_weight_version", {"new_version": "5"})):
                r = requests.post(f"{base}{path}", json=payload, timeout=30)
                assert r.status_code == 200 and r.json()["success"], r.text
            flush = requests.post(f"{base}/flush_cache", timeout=30).json()
            assert all(v["body"].startswith("Cache flushed") for v in flush["results"].values())

            # /workers: list, remove, add back.
            listing = requests.get(f"{base}/workers", timeout=5).json()
            assert listing["total"] == 2
            gone = requests.delete(f"{base}/workers/http://{addrs[1]}", timeout=5)
            assert gone.status_code == 200
            assert requests.get(f"{base}/health", timeout=5).json() == {"healthy": 1, "total": 1}
            back = requests.post(f"{base}/workers", json={"url": addrs[1]}, timeout=10)
            assert back.status_code == 202 and back.json()["worker"]["is_healthy"] is True
            assert requests.get(f"{base}/workers", timeout=5).json()["total"] == 2
            assert requests.post(f"{base}/workers", json={"nope": 1}, timeout=5).status_code == 400
        _behind_sglang_router(addrs)
    # The pool stopped its servers when it was stopped.
    time.sleep(1.0)
    assert not any(http_ok(f"http://{a}/health", timeout=1.0) for a in addrs)


def _router_loads(base: str) -> dict[str, int]:
    rows = requests.get(f"{base}/get_loads", timeout=10).json()["workers"]
    return {w["worker"]: w["load"] for w in rows}


def _behind_sglang_router(addrs: list[str]) -> None:
    """The pool behind SGLang's own router (``sglang-router``): it routes, and its load-aware
    policy reads each server's ``/get_load`` (a server without it reports -1)."""
    import threading

    from tests.support.procs import log_tail, spawn

    if importlib.util.find_spec("sglang_router") is None:
        pytest.skip("sglang-router is not installed (make setup installs it)")
    port = find_free_port()
    base = f"http://127.0.0.1:{port}"
    urls = [f"http://{a}" for a in addrs]
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
           "--port", str(port), "--worker-urls", *urls, "--policy", "power_of_two",
           "--log-level", "warn"]
    with spawn(cmd) as (router, log):
        assert wait_healthy(f"{base}/health", 60, alive=lambda: router.poll() is None), log_tail(log)
        body = {"input_ids": [3, 4], "sampling_params": {"max_new_tokens": 3}}
        r = requests.post(f"{base}/generate", json=body, timeout=60)
        assert r.status_code == 200 and len(r.json()["output_ids"]) >= 1, r.text
        assert _router_loads(base) == {u: 0 for u in urls}  # idle: 0, not -1
        # a long generation on the first server: the router sees its tokens, and 0 on the other
        ctx = requests.get(f"{urls[0]}/server_info", timeout=10).json()["context_length"]
        long = {"input_ids": [3, 4, 5], "rid": "busy",
                "sampling_params": {"max_new_tokens": ctx - 4, "ignore_eos": True}}
        t = threading.Thread(target=requests.post, args=(f"{urls[0]}/generate",),
                             kwargs={"json": long, "timeout": 120}, daemon=True)
        t.start()
        try:
            deadline, loads = time.time() + 60, {}
            while time.time() < deadline:
                loads = _router_loads(base)
                if loads[urls[0]] > 3:
                    break
                time.sleep(0.2)
            assert loads[urls[0]] > 3 and loads[urls[1]] == 0, loads
        finally:
            requests.post(f"{urls[0]}/abort_request", json={"rid": "busy"}, timeout=30)
            t.join(timeout=60)


def test_pool_failure_message_contains_log_tail(tmp_path, capsys):
    from servers.launch_pool import main

    code = main(["--n", "1", "--model-path", str(tmp_path / "missing"), "--timeout", "60",
                 "--log-dir", str(tmp_path / "logs")])
    err = capsys.readouterr().err
    assert code == 1
    assert "exited with code" in err and "is not a directory" in err
