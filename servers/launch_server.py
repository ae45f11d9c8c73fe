"""``python -m servers.launch_server --model-path DIR --host 127.0.0.1 --port P [...]``.

Starts the embedded SGLang-protocol server: loads the model, starts the engine thread and
serves FastAPI with uvicorn. Flags are spelled as in ``python -m sglang.launch_server``
(see ``--help`` and docs/servers.md).
"""

from __future__ import annotations

import logging
import os
import sys


def main(argv: list[str] | None = None) -> int:
    from servers.server_args import parse_args

    args = parse_args(argv)
    # Threads first: torch reads OMP_NUM_THREADS when it initialises.
    os.environ.setdefault("OMP_NUM_THREADS", str(args.num_threads))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="[%(asctime)s %(name)s %(levelname)s] %(message)s",
    )
    import torch
    import uvicorn

    from servers.engine.engine import Engine
    from servers.engine.model_runner import ModelRunner
    from servers.http_server import create_app
    from servers.protocol.responses import Detokenizer
    from servers.state import ServerState

    if logging.getLogger().level > logging.INFO:
        # transformers' "Loading weights" bar is start-up chatter: shown at info and debug only
        from transformers.utils.logging import disable_progress_bar

        disable_progress_bar()
    torch.set_num_threads(args.num_threads)
    if args.random_seed is not None:
        torch.manual_seed(args.random_seed)
    try:
        runner = ModelRunner(
            args.model_path, dtype=args.dtype, device=args.device,
            context_length=args.context_length, tokenizer_path=args.tokenizer_path,
            skip_tokenizer_init=args.skip_tokenizer_init, is_embedding=args.is_embedding,
        )
    except Exception as e:
        logging.getLogger("servers").error("failed to load the model: %s", e)
        return 1
    engine = Engine(
        runner, weight_version=args.weight_version,
        max_running_requests=args.max_running_requests or 256,
        max_prefill_tokens=args.max_prefill_tokens, random_seed=args.random_seed,
        max_loras_per_batch=args.max_loras_per_batch,
    )
    if args.enable_return_routed_experts:
        try:
            runner.enable_routed_experts()
        except ValueError as e:
            logging.getLogger("servers").error("%s", e)
            return 2
    if args.enable_lora:
        from servers.engine.lora import LoRAError, enable_lora

        try:
            enable_lora(runner, args)
        except (LoRAError, ValueError) as e:
            logging.getLogger("servers").error("--lora-paths: %s", e)
            return 2
    state = ServerState(args=args, runner=runner, engine=engine,
                        detok=Detokenizer(runner.tokenizer), model_path=args.model_path)
    app = create_app(state)
    _exit_with_parent()
    logging.getLogger("servers").info(
        "serving %s on http://%s:%d (device=%s dtype=%s threads=%d)", args.model_path,
        args.host, args.port, args.device, runner.dtype, args.num_threads,
    )
    # SIGTERM: stop waiting on open requests after a few seconds (a rendezvous or a long
    # generation must not keep a server that was told to go)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                timeout_keep_alive=30, access_log=args.log_level == "debug",
                timeout_graceful_shutdown=5)
    return 0


def _exit_with_parent() -> None:
    """Under a pool launcher (``AREALITE_EXIT_WITH_PARENT=1``), exit when the launcher dies,
    even by SIGKILL, so no orphaned server keeps its port and memory."""
    if os.environ.get("AREALITE_EXIT_WITH_PARENT") != "1":
        return
    import threading
    import time

    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
