"""``arealite tinker-server CONFIG [key=value ...]``: serve the Tinker API over a local model and
an already running server pool (``rollout.server_addrs``; start one with
``python -m servers.launch_pool`` or ``servers.launch_server``, with ``--enable-lora`` for LoRA
training clients). Prints ``tinker service at http://HOST:PORT`` once it listens; point the
SDK's ``base_url`` (or ``TINKER_BASE_URL``) there. docs/tinker.md has a walk-through.
"""

from __future__ import annotations

import logging
import sys

from arealite.api.config.loader import ConfigError, apply_overrides, build_config, read_yaml
from arealite.tinker.config import API_KEY_ENV, TinkerServerConfig
from arealite.utils.keys import resolve
from arealite.utils.network import find_free_port


def load(path: str, overrides: list[str]) -> TinkerServerConfig:
    return build_config(TinkerServerConfig, apply_overrides(read_yaml(path), overrides))


def serve(config: TinkerServerConfig) -> None:
    import asyncio

    import uvicorn

    from arealite.tinker.app import build_app
    from arealite.tinker.service import TinkerService

    if not config.rollout.server_addrs:
        raise ConfigError("rollout.server_addrs is empty: give the addresses of the server pool")
    if not config.model.path:
        raise ConfigError("model.path is empty: give a local HF model directory")
    port = config.port or find_free_port(config.host)
    svc = TinkerService(config)
    app = build_app(svc, resolve(config.api_key, API_KEY_ENV))
    server = uvicorn.Server(uvicorn.Config(app, host=config.host, port=port,
                                           log_level="warning", lifespan="off"))

    async def run() -> None:
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.05)
        if server.started:
            print(f"tinker service at http://{config.host}:{port}", flush=True)
        try:
            await task
        finally:
            await svc.close()

    asyncio.run(run())


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        serve(load(argv[0], argv[1:]))
    except ConfigError as e:
        print(f"arealite: config error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
