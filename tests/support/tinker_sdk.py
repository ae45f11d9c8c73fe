"""The official ``tinker`` SDK's own low-level client, for the one request its public API never
sends: a ``create_model`` without ``lora_config`` (a full-weight model on arealite's service)."""

from __future__ import annotations

import time
from typing import Any


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
