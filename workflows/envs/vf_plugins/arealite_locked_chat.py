"""``arealite_locked_chat``: verifiers' own chat program (its ``null`` harness, unchanged) run with this
environment's Python instead of a ``uv``-built one.

verifiers' built-in harnesses ship their program as a PEP 723 script that the runtime prepares
with ``uv sync --script`` (installing ``uv`` first, with the network on, the first time), so a run
fetches packages at start-up. Here those packages come from the lock (the venv, plus what
``docs/environments.md`` lists): the runtime is asked to run the very same bundled script with
``sys.executable``. Everything else (the chat loop, the interception endpoint, MCP tools, the
trace) is the ``null`` harness's. With a network-connected container runtime, the plain
``null`` harness (``harness.id: null``) needs none of this.

A verifiers plugin: verifiers imports a harness by its id as a top-level module, so this
folder (``workflows/envs/vf_plugins``) is put on ``sys.path`` by ``workflows.envs.verifiers_env``
and the id is ``arealite_locked_chat``.
"""

from __future__ import annotations

import hashlib
import os
import sys
import uuid
from typing import Any

from verifiers.v1.harnesses.null.harness import NullHarness, NullHarnessConfig
from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE, launch_chat_program

__all__ = ["LockedChatHarness"]


class _LockedScripts:
    """The rollout's runtime, except that a PEP 723 script runs with this interpreter."""

    def __init__(self, runtime: Any) -> None:
        self._runtime = runtime

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)

    async def prepare_uv_script(self, script: str | bytes, env: dict | None = None, *,
                                activate: bool = True) -> list[str]:
        data = script.encode() if isinstance(script, str) else script
        path = f"{self._runtime.scripts_dir}/{hashlib.sha256(data).hexdigest()}.py"
        # written aside and renamed into place (atomic), as verifiers' own preparation does:
        # concurrent rollouts share the path, and one must never run a half-written script
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        await self._runtime.write(tmp, data)
        moved = await self._runtime.run(["mv", "-f", tmp, path], {})
        if moved.exit_code != 0:
            raise RuntimeError(f"could not place the chat program at {path}: {moved}")
        return [sys.executable, path]


class LockedChatHarness(NullHarness):
    """The ``null`` harness's program, run by this interpreter (``PYTHONPATH`` inherited)."""

    async def setup(self, runtime: Any) -> None:
        return None  # nothing to install: the program's packages are the venv's

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data,
                     tool_interception_url=None):
        system_prompt, prompt = self.resolve_prompt(data)
        env = {**self.config.resolved_env}
        if os.environ.get("PYTHONPATH"):  # the lock's extra packages, as this process has them
            env.setdefault("PYTHONPATH", os.environ["PYTHONPATH"])
        return await launch_chat_program(
            CHAT_PROGRAM_SOURCE, self.config, ctx, trace, _LockedScripts(runtime), endpoint,
            secret, mcp_urls, system_prompt, prompt,
            extra_args=[f"--tool-interception-url={tool_interception_url}"]
            if tool_interception_url else (),
            env=env,
        )


LockedChatHarnessConfig = NullHarnessConfig
