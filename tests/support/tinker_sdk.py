"""The Tinker service as the tests start it (``tinker_service``), and the official ``tinker``
SDK's own low-level client for the one request its public API never sends: a ``create_model``
without ``lora_config`` (a full-weight model on arealite's service)."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from arealite.utils.network import LOOPBACK, find_free_port
from tests.support.procs import embedded_server, log_tail, spawn


@contextlib.contextmanager
def tinker_service(model_dir: Path, root: Path, key: str, server_args: list[str],
                   timeout: float = 300.0) -> Iterator[str]:
    """``base_url`` of ``arealite tinker-server configs/tinker/tiny.yaml`` over one embedded
    server (started with ``server_args``), both stopped on exit."""
    import pytest

    with embedded_server(str(model_dir), server_args, timeout=timeout) as addr:
        port = find_free_port()
        cmd = [sys.executable, "-m", "arealite.cli.main", "tinker-server",
               "configs/tinker/tiny.yaml", f"model.path={model_dir}",
               f"rollout.server_addrs=[{addr}]", f"fileroot={root}", f"port={port}",
               f"api_key={key}"]
        with spawn(cmd, env={"TINKER_TELEMETRY": "0"}) as (proc, log):
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and proc.poll() is None:
                with open(log) as f:
                    if "tinker service at" in f.read():
                        break
                time.sleep(0.5)
            else:
                pytest.fail(f"the tinker service did not start:\n{log_tail(log)}")
            yield f"http://{LOOPBACK}:{port}"


def full_weight_client(sc: Any, base_model: str) -> Any:
    """A ``TrainingClient`` on a model created without ``lora_config``, the way the SDK's
    ``create_lora_training_client`` builds one (its request, future and info calls)."""
    from tinker import types
    from tinker.lib.api_future_impl import _APIFuture
    from tinker.lib.client_connection_pool_type import ClientConnectionPoolType
    from tinker.lib.public_interfaces.training_client import TrainingClient, fetch_training_info

    holder = sc.holder
    seq = holder.get_training_client_id()

    async def create():
        with holder.aclient(ClientConnectionPoolType.TRAIN) as http:
            fut = await http.models.create(request=types.CreateModelRequest(
                session_id=holder.get_session_id(), model_seq_id=seq, base_model=base_model,
                lora_config=None))
        made = await _APIFuture(types.CreateModelResponse, holder, fut,
                                request_start_time=time.time(),
                                request_type="CreateModel").result_async()
        return TrainingClient(holder, model_seq_id=seq, model_id=made.model_id,
                              info=await fetch_training_info(holder, made.model_id))

    return holder.run_coroutine_threadsafe(create()).result()
