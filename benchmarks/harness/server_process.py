"""A server of this repository (``python -m servers.launch_server``, or the gateway) in its own
process group on a free port, for benchmarks that time requests against it and for the fuzzer:
``with Server(model_path) as s: secs, tokens = s.run(requests)``."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time


async def _one(session, addr: str, prompt: list[int], new: int) -> int:
    body = {"input_ids": prompt, "return_logprob": True,
            "sampling_params": {"max_new_tokens": new, "temperature": 1.0, "ignore_eos": True}}
    async with session.post(f"http://{addr}/generate", json=body) as r:
        out = await r.json()
        return out["meta_info"]["completion_tokens"]


async def _fire(addr: str, reqs: list[tuple[list[int], int]]) -> tuple[float, int]:
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as s:
        await _one(s, addr, [5, 6, 7], 4)  # warm-up
        t0 = time.perf_counter()
        counts = await asyncio.gather(*(_one(s, addr, p, m) for p, m in reqs))
        return time.perf_counter() - t0, sum(counts)


class Server:
    """The embedded server in its own process group; idle (blocked) while baselines run."""

    def __init__(self, model_path: str | None, *extra: str, module: str = "servers.launch_server",
                 log_level: str = "warning") -> None:
        """``python -m module`` on a free port; ``model_path`` None for a gateway."""
        from arealite.launcher.supervisor import DIE_WITH_PARENT
        from servers.net import find_free_port

        self.port = find_free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        cmd = [sys.executable, "-m", module, "--port", str(self.port), "--log-level", log_level,
               *extra]
        if model_path is not None:
            cmd += ["--model-path", model_path, "--num-threads", "1"]
        # the server goes when this process does, also when a SIGTERM or SIGKILL skips __exit__
        # (PR_SET_PDEATHSIG fires when the starting *thread* ends: start servers from the thread
        # that keeps them, as every caller here does from the main thread)
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True, preexec_fn=DIE_WITH_PARENT)

    def __enter__(self) -> Server:
        from servers.net import wait_healthy

        url = f"http://127.0.0.1:{self.port}/health"
        if not wait_healthy(url, 120, alive=lambda: self.proc.poll() is None):
            self.__exit__()
            self.log.seek(0)
            raise RuntimeError(f"server failed to start:\n{self.log.read()[-3000:]}")
        return self

    def run(self, reqs: list[tuple[list[int], int]]) -> tuple[float, int]:
        """All ``(prompt ids, new tokens)`` requests at once; (seconds, completion tokens)."""
        return asyncio.run(_fire(f"127.0.0.1:{self.port}", reqs))

    def __exit__(self, *exc) -> None:
        os.killpg(self.proc.pid, 15)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
