"""The client's half of a same-host (``tensor``) update: hand the paused servers to the trainer
and wait for its pushes.

The trainer ranks post ``/update_weights_from_tensor`` themselves (each to the servers on its
host, ``arealite/weights/tensor_upload.py``): the payload names shared memory of the trainer's
process, so it cannot come from anywhere else. The client publishes ``meta.targets`` once every
server is paused with its update session open, then waits for ``meta.target_failures``.
"""

from __future__ import annotations

import asyncio
import time

from arealite.api.io_struct import WeightUpdateMeta


async def await_tensor_push(alive: list[str], meta: WeightUpdateMeta, failed: dict[str, str],
                            timeout: float, poll: float = 0.005,
                            route: str = "/update_weights_from_tensor",
                            ) -> tuple[list[str], str | None]:
    """``(servers updated, None)`` or ``(..., why the whole update failed)``; per-server
    failures go to ``failed``."""
    meta.target_failures = None
    meta.targets = list(alive)  # last: the trainer starts pushing when it sees it
    deadline = time.monotonic() + timeout
    while meta.target_failures is None:
        if meta.abort_reason:
            return [], f"the trainer's push failed: {meta.abort_reason}"
        if time.monotonic() >= deadline:
            return [], f"the trainer did not push the weights within {timeout:.0f} s"
        await asyncio.sleep(poll)
    got = dict(meta.target_failures)
    if "*" in got:
        return [], f"the trainer's push failed: {got['*']}"
    for a, reason in got.items():
        failed.setdefault(a, f"{route}: {reason}")
    return [a for a in alive if a not in got], None
