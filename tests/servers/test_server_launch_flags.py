"""Launch flags: one launcher plan starts either backend, no accidental open bind, and a
weight-group rendezvous that is bounded and never outlives a SIGTERM, and a quiet log level that
is quiet."""

from __future__ import annotations

import signal
import sys
import threading
import time

import pytest
import requests

from servers.server_args import parse_args


def test_every_flag_the_launcher_sends_is_accepted_by_the_embedded_server():
    from arealite.api.config.experiment import GRPOConfig
    from arealite.launcher import plan

    cfg = GRPOConfig.model_validate({
        "actor": {"path": "/m", "lora": {"rank": 4, "target_modules": ["q_proj", "v_proj"]}},
        "servers": {"api_key": "k", "admin_api_key": "a", "max_running_requests": 8,
                   "context_length": 256, "mem_fraction_static": 0.8, "enable_metrics": True,
                   "skip_tokenizer_init": True, "device": "cpu", "random_seed": 3,
                   "dtype": "bfloat16", "log_level": "info",
                   "extra_args": ["--trust-remote-code", "--disable-radix-cache",
                                  "--chunked-prefill-size", "4096"]},
        "launcher": {"server_backend": "embedded"},
    })
    (spec,) = plan.server_specs(cfg, [7], environ={})
    assert spec.cmd[1:3] == ["-m", "servers.launch_server"]
    # keys travel in the environment the launcher sets, never on the command line
    assert "k" not in spec.cmd and spec.env["AREALITE_API_KEY"] == "k"
    with pytest.MonkeyPatch.context() as mp:
        for name, value in spec.env.items():
            mp.setenv(name, value)
        args = parse_args(spec.cmd[3:])
    assert args.mem_fraction_static == 0.8 and args.context_length == 256
    assert args.api_key == "k" and args.admin_api_key == "a" and args.dtype == "bfloat16"
    # a LoRA run's servers load adapters at run time
    assert args.enable_lora and args.max_lora_rank == 4 and args.max_loras_per_batch == 8
    assert args.lora_target_modules == ["q_proj", "v_proj"]
    assert "k" not in args.launch_command.split()


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "::", "node-7"])
def test_a_reachable_bind_needs_a_key_or_insecure(host, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(["--model-path", "/m", "--host", host])
    assert e.value.code == 2 and "--insecure" in capsys.readouterr().err
    assert parse_args(["--model-path", "/m", "--host", host, "--api-key", "k"]).host == host
    assert parse_args(["--model-path", "/m", "--host", host, "--insecure"]).insecure


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "::1"])
def test_loopback_needs_no_key(host):
    assert parse_args(["--model-path", "/m", "--host", host]).api_key is None


@pytest.mark.integration
def test_rendezvous_is_bounded_and_sigterm_still_stops_the_server(tiny_model_dir):
    from arealite.utils.network import find_free_port
    from tests.support.procs import spawn, wait_http_ok

    nobody = find_free_port()  # nothing listens here: the rendezvous can only time out
    body = {"master_address": "127.0.0.1", "master_port": nobody, "rank_offset": 1,
            "world_size": 2, "backend": "gloo"}
    for timeout, expect_answer in (("3", True), ("600", False)):
        port = find_free_port()
        cmd = [sys.executable, "-m", "servers.launch_server", "--model-path",
               str(tiny_model_dir), "--port", str(port), "--weight-group-timeout", timeout]
        with spawn(cmd) as (proc, _log):
            base = f"http://127.0.0.1:{port}"
            assert wait_http_ok(f"{base}/health", 120, alive=lambda: proc.poll() is None)
            if expect_answer:
                t0 = time.monotonic()
                r = requests.post(f"{base}/init_weights_update_group", json=body, timeout=120)
                assert r.status_code == 400 and time.monotonic() - t0 < 60
                assert requests.get(f"{base}/health", timeout=10).status_code == 200
                continue
            url = f"{base}/init_weights_update_group"
            threading.Thread(target=requests.post, args=(url,), daemon=True,
                             kwargs={"json": body, "timeout": 120}).start()
            time.sleep(2)
            assert requests.get(f"{base}/health", timeout=10).status_code == 200  # still serving
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)
            assert time.monotonic() - t0 < 30, "SIGTERM waited on the rendezvous"


@pytest.mark.integration
def test_log_level_warning_starts_without_progress_bars(tiny_model_dir):
    # the launcher starts servers at --log-level warning: their log is then what went wrong, not
    # transformers' "Loading weights" bar (which the default, info, shows, as SGLang shows its own)
    from arealite.utils.network import find_free_port
    from tests.support.procs import spawn, wait_http_ok

    port = find_free_port()
    cmd = [sys.executable, "-m", "servers.launch_server", "--model-path", str(tiny_model_dir),
           "--port", str(port), "--log-level", "warning"]
    with spawn(cmd) as (proc, log):
        assert wait_http_ok(f"http://127.0.0.1:{port}/health", 120,
                            alive=lambda: proc.poll() is None)
        text = open(log).read()
    assert "Loading weights" not in text, text[-2000:]
