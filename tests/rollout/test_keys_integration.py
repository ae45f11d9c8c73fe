"""Keys end to end: an embedded server started with an api key and an admin key (from the
environment, as the launcher starts it), a client given the keys (config or environment) that
generates and moves the server's weights from disk and by broadcast, clients without the keys
or with wrong ones failing with a message that says what to set, and a keyed gateway that
refuses unauthenticated changes to its worker list but forwards an authenticated client."""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request

import pytest
import torch

from arealite.api.io_struct import ParamSpec, WeightUpdateError, WeightUpdateMeta
from arealite.utils.network import LOOPBACK, find_free_port, wait_http_ok
from tests.rollout.test_remote_engine_integration import (
    make_engine,
    perturbed_state,
    request,
    run_all,
    save_model,
)
from tests.support.procs import log_tail, spawn

pytestmark = pytest.mark.integration

API, ADMIN = "k-api-123", "k-admin-456"
KEYS_ENV = {"AREALITE_API_KEY": API, "AREALITE_ADMIN_API_KEY": ADMIN}


@pytest.fixture(scope="module")
def keyed_server(tiny_model_dir):
    port = find_free_port()
    cmd = [sys.executable, "-m", "servers.launch_server", "--model-path", str(tiny_model_dir),
           "--host", LOOPBACK, "--port", str(port), "--weight-version", "0",
           "--log-level", "warning"]
    with spawn(cmd, env=KEYS_ENV) as (proc, log):
        if not wait_http_ok(f"http://{LOOPBACK}:{port}/health", 120, alive=lambda: proc.poll() is None):
            raise RuntimeError(f"keyed server did not start:\n{log_tail(log)}")
        yield f"{LOOPBACK}:{port}"


def _http(method: str, url: str, body: dict | None = None, key: str | None = None) -> int:
    req = urllib.request.Request(url, method=method,
                                 data=None if body is None else json.dumps(body).encode())
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_keyed_client_generates_and_updates_weights(keyed_server, tiny_model_dir, tmp_path,
                                                    monkeypatch):
    import torch.distributed as dist

    from arealite.utils.distributed import destroy_custom_process_group, init_custom_process_group

    monkeypatch.setenv("AREALITE_API_KEY", API)  # the api key from the environment ...
    eng = make_engine([keyed_server], admin_api_key=ADMIN)  # ... the admin key from the config
    pg = None
    try:
        assert run_all(eng, [request("k0", 4)])[0].output_versions == [0] * 4
        # disk: pause -> load -> continue, all admin calls
        state = perturbed_state(tiny_model_dir, seed=31)
        save_model(tiny_model_dir, state, tmp_path / "v1")
        meta = WeightUpdateMeta(type="disk", version=1, path=str(tmp_path / "v1"))
        meta.write_disk_marker()
        eng.update_weights(meta).result(60)
        assert run_all(eng, [request("k1", 4)])[0].output_versions == [1] * 4
        # broadcast, this test as the trainer's rank 0
        state = perturbed_state(tiny_model_dir, seed=32)
        names = sorted(state)
        meta = WeightUpdateMeta(type="distributed", version=2, master_port=find_free_port(),
                                param_specs=[[ParamSpec(k, tuple(state[k].shape), "float32")
                                              for k in names]], timeout=60)
        fut = eng.update_weights(meta)
        deadline = time.monotonic() + 30
        while meta.world_size is None and time.monotonic() < deadline and not fut.done():
            time.sleep(0.01)
        pg = init_custom_process_group(
            backend=meta.backend, init_method=f"tcp://{meta.master_address}:{meta.master_port}",
            world_size=meta.world_size, rank=0, group_name=meta.group_name, timeout=60)
        dist.broadcast(torch.cat([state[k].contiguous().view(-1).view(torch.uint8) for k in names]),
                       src=0, group=pg)
        fut.result(60)
        eng.verify_weights({names[0]: state[names[0]]})  # /get_weights_by_name: admin too
        assert run_all(eng, [request("k2", 4)])[0].output_versions == [2] * 4
    finally:
        eng.destroy()
        destroy_custom_process_group(pg)


@pytest.mark.parametrize("key", [None, "wrong"])
def test_client_without_the_right_api_key_fails_at_start_with_a_hint(keyed_server, key,
                                                                     monkeypatch):
    monkeypatch.delenv("AREALITE_API_KEY", raising=False)
    monkeypatch.delenv("AREALITE_ADMIN_API_KEY", raising=False)
    with pytest.raises(PermissionError, match="AREALITE_API_KEY") as e:
        make_engine([keyed_server], api_key=key)
    assert "refused" in str(e.value) if key else "none was given" in str(e.value)
    assert "wrong" not in str(e.value)  # never echo a key


def test_wrong_admin_key_fails_the_update_with_a_hint(keyed_server, tmp_path, monkeypatch):
    monkeypatch.delenv("AREALITE_ADMIN_API_KEY", raising=False)
    eng = make_engine([keyed_server], api_key=API, admin_api_key="nope")
    try:
        assert run_all(eng, [request("a0", 2)])[0].output_len == 2  # generation needs only the api key
        meta = WeightUpdateMeta(type="disk", version=eng.get_version() + 1, path=str(tmp_path))
        meta.write_disk_marker()
        with pytest.raises(WeightUpdateError, match="HTTP 401.*AREALITE_ADMIN_API_KEY"):
            eng.update_weights(meta).result(60)
    finally:
        eng.destroy()


def test_keyed_gateway_guards_its_worker_list_and_forwards_keys(keyed_server, monkeypatch):
    port = find_free_port()
    base = f"http://{LOOPBACK}:{port}"
    cmd = [sys.executable, "-m", "servers.gateway", "--servers", keyed_server, "--port", str(port),
           "--log-level", "warning"]
    with spawn(cmd, env=KEYS_ENV) as (proc, log):
        assert wait_http_ok(f"{base}/health", 60, alive=lambda: proc.poll() is None), log_tail(log)
        other = f"{LOOPBACK}:{find_free_port()}"
        for key in (None, "wrong", API):  # the api key is not enough to change the pool
            assert _http("POST", f"{base}/add_worker?url={other}", key=key) == 401
            assert _http("POST", f"{base}/remove_worker?url={keyed_server}", key=key) == 401
            assert _http("POST", f"{base}/workers", {"url": other}, key=key) == 401
            assert _http("DELETE", f"{base}/workers/{keyed_server}", key=key) == 401
            assert _http("POST", f"{base}/pause_generation", {}, key=key) == 401
        assert _http("GET", f"{base}/workers") == 401
        assert _http("GET", f"{base}/workers", key=API) == 200
        assert _http("GET", f"{base}/model_info", key=API) == 200  # forwarded with the key
        assert _http("POST", f"{base}/workers", {"url": other}, key=ADMIN) == 202
        assert _http("DELETE", f"{base}/workers/{other}", key=ADMIN) == 200
        # a keyed client through the gateway: generate (forwarded Authorization)
        monkeypatch.delenv("AREALITE_API_KEY", raising=False)
        eng = make_engine([f"{LOOPBACK}:{port}"], api_key=API, admin_api_key=ADMIN)
        try:
            assert run_all(eng, [request("gw", 3)])[0].output_len == 3
        finally:
            eng.destroy()
