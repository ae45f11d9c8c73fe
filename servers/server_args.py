"""Launch flags of the embedded server, spelled as ``python -m sglang.launch_server`` spells them."""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import sys
from dataclasses import dataclass

from servers.protocol.tool_parser import PARSERS

API_KEY_ENV = "AREALITE_API_KEY"  # read when --api-key is not given
ADMIN_API_KEY_ENV = "AREALITE_ADMIN_API_KEY"  # read when --admin-api-key is not given


@dataclass
class ServerArgs:
    model_path: str
    tokenizer_path: str | None = None
    host: str = "127.0.0.1"
    port: int = 30000
    dtype: str = "auto"
    device: str = "cpu"
    random_seed: int | None = None
    weight_version: str = "default"
    context_length: int | None = None
    max_running_requests: int | None = None
    max_prefill_tokens: int = 16384
    api_key: str | None = None
    admin_api_key: str | None = None
    enable_metrics: bool = False
    log_level: str = "info"
    served_model_name: str | None = None
    skip_tokenizer_init: bool = False
    num_threads: int = 1
    tp_size: int = 1
    dp_size: int = 1
    load_format: str = "auto"
    incremental_streaming_output: bool = False
    weight_group_timeout: float = 60.0
    insecure: bool = False
    weight_load_root: list[str] = dataclasses.field(default_factory=list)
    mem_fraction_static: float | None = None
    allow_auto_truncate: bool = False
    tool_call_parser: str | None = None
    constrained_json_disable_any_whitespace: bool = False
    constrained_json_max_whitespace_cnt: int | None = None
    health_stall_timeout: float = 60.0
    is_embedding: bool = False
    enable_lora: bool = False
    enable_return_routed_experts: bool = False
    lora_paths: list[str] = dataclasses.field(default_factory=list)
    max_loras_per_batch: int = 8
    max_lora_rank: int | None = None
    lora_target_modules: list[str] = dataclasses.field(default_factory=list)
    launch_command: str = ""

    def weight_roots(self) -> list[str]:
        """Folders /update_weights_from_disk may read: the one holding --model-path, and each
        --weight-load-root."""
        return [os.path.dirname(os.path.abspath(self.model_path)), *self.weight_load_root]

    def resolved(self) -> dict:
        """The flat dict ``/server_info`` reports (SGLang reports every resolved arg)."""
        d = dataclasses.asdict(self)
        d["api_key"] = None if self.api_key is None else "<redacted>"
        d["admin_api_key"] = None if self.admin_api_key is None else "<redacted>"
        d["served_model_name"] = self.served_model_name or self.model_path
        d["tokenizer_path"] = self.tokenizer_path or self.model_path
        d["disaggregation_mode"] = "null"
        return d


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m servers.launch_server",
        description="Embedded inference server speaking SGLang's HTTP protocol (CPU or GPU).",
    )
    p.add_argument("--model-path", "--model", dest="model_path", required=True,
                   help="HF model directory (config, weights, tokenizer)")
    p.add_argument("--tokenizer-path", default=None)
    p.add_argument("--host", default="127.0.0.1", help="bind address (loopback by default)")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--dtype", default="auto",
                   choices=["auto", "half", "float16", "bfloat16", "float", "float32"])
    p.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:1, ...")
    p.add_argument("--random-seed", type=int, default=None)
    p.add_argument("--weight-version", default="default", help="initial weight_version")
    p.add_argument("--context-length", type=int, default=None,
                   help="max prompt + output tokens (default: the model's max positions)")
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--max-prefill-tokens", type=int, default=16384,
                   help="padded prompt tokens admitted into one prefill forward")
    p.add_argument("--api-key", default=None, help=f"default: ${API_KEY_ENV}")
    p.add_argument("--admin-api-key", default=None, help=f"default: ${ADMIN_API_KEY_ENV}")
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--enable-return-routed-experts", action="store_true",
                   help="record each token's routed experts (MoE models) for requests that set "
                   "return_routed_experts")
    p.add_argument("--log-level", default="info",
                   choices=["debug", "info", "warning", "error", "critical"])
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--skip-tokenizer-init", action="store_true")
    p.add_argument("--num-threads", type=int, default=None,
                   help="torch intra-op threads (default: $OMP_NUM_THREADS or 1)")
    p.add_argument("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    p.add_argument("--dp-size", type=int, default=1)
    p.add_argument("--load-format", default="auto")
    p.add_argument("--incremental-streaming-output", action="store_true")
    p.add_argument("--weight-group-timeout", type=float, default=60.0,
                   help="seconds a weight-update group waits on a rendezvous or broadcast")
    p.add_argument("--weight-load-root", action="append", default=[], metavar="DIR",
                   help="also let /update_weights_from_disk read checkpoints under DIR "
                        "(repeatable; the folder holding --model-path is always allowed)")
    p.add_argument("--insecure", action="store_true", help=INSECURE_HELP)
    compat = p.add_argument_group(
        "SGLang flags accepted so one launch plan starts either backend; ignored here")
    compat.add_argument("--mem-fraction-static", type=float, default=None,
                        help="the KV cache here grows on demand")
    for flag in ("--trust-remote-code", "--disable-radix-cache", "--disable-cuda-graph",
                 "--enable-memory-saver"):
        compat.add_argument(flag, action="store_true", dest=flag[2:].replace("-", "_") + "_ignored")
    for flag in ("--chunked-prefill-size", "--cuda-graph-max-bs", "--watchdog-timeout"):
        compat.add_argument(flag, default=None, dest=flag[2:].replace("-", "_") + "_ignored")
    p.add_argument("--health-stall-timeout", type=float, default=60.0,
                   help="/health answers 503 while one engine step has run longer than this")
    p.add_argument("--tool-call-parser", default=None, choices=list(PARSERS),
                   help="parse tool calls in /v1/chat/completions output (qwen25: Hermes "
                        "<tool_call>{json}</tool_call> blocks)")
    p.add_argument("--constrained-json-disable-any-whitespace", action="store_true",
                   help="JSON-constrained output in compact form (SGLang's flag, xgrammar)")
    p.add_argument("--constrained-json-max-whitespace-cnt", type=int, default=None,
                   help="most consecutive whitespace characters in JSON-constrained output "
                        "(SGLang's flag, xgrammar; default unbounded)")
    p.add_argument("--is-embedding", action="store_true",
                   help="serve a reward model (a *ForSequenceClassification checkpoint, which "
                        "is also detected without the flag) on /classify and /encode")
    p.add_argument("--allow-auto-truncate", action="store_true",
                   help="cut prompts and max_new_tokens to the context instead of answering 400")
    lora = p.add_argument_group("LoRA adapters (SGLang's flags)")
    lora.add_argument("--enable-lora", action="store_true", default=None,
                      help="serve LoRA adapters (on by itself when --lora-paths is given)")
    lora.add_argument("--lora-paths", nargs="*", default=[], metavar="ADAPTER",
                      help='adapters loaded at start: PATH, NAME=PATH or JSON {"lora_name": '
                           '..., "lora_path": ..., "pinned": ...}')
    lora.add_argument("--max-loras-per-batch", type=int, default=8,
                      help="distinct adapters in one running batch (others wait)")
    lora.add_argument("--max-lora-rank", type=int, default=None,
                      help="refuse adapters of a higher rank")
    lora.add_argument("--lora-target-modules", nargs="*", default=[],
                      help="refuse adapters on other modules (e.g. q_proj v_proj)")
    return p


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


INSECURE_HELP = ("allow a non-loopback --host without --api-key (anyone who can reach the port "
                 "can then generate, pause and load weights)")


def check_bind(parser: argparse.ArgumentParser, host: str, insecure: bool, *keys: str | None) -> None:
    """Refuse (exit 2) to serve a non-loopback address with no key, unless ``--insecure``."""
    if not (insecure or any(keys) or is_loopback(host)):
        parser.error(f"--host {host} is reachable from other machines: set --api-key (and "
                     "--admin-api-key), or pass --insecure to serve without one")


def parse_args(argv: list[str] | None = None) -> ServerArgs:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.tp_size != 1 or ns.dp_size != 1:
        parser.error("the embedded server runs one model replica: --tp-size and --dp-size must be 1")
    if ns.num_threads is None:
        ns.num_threads = int(os.environ.get("OMP_NUM_THREADS", "1") or 1)
    if ns.num_threads < 1:
        parser.error("--num-threads must be >= 1")
    if not 1 <= ns.port <= 65535:
        parser.error("--port must be in [1, 65535]")
    # Keys may come from the environment (kept out of argv, where ps and /server_info's
    # launch_command would show them); a flag wins.
    # As SGLang's ServerArgs: the served name is fixed at launch (a later
    # update_weights_from_disk changes the weights' path, not the name clients use).
    ns.served_model_name = ns.served_model_name or ns.model_path
    ns.api_key = ns.api_key or os.environ.get(API_KEY_ENV) or None
    ns.admin_api_key = ns.admin_api_key or os.environ.get(ADMIN_API_KEY_ENV) or None
    check_bind(parser, ns.host, ns.insecure, ns.api_key, ns.admin_api_key)
    for name in ("context_length", "max_running_requests"):
        v = getattr(ns, name)
        if v is not None and v < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if ns.enable_lora is None:  # SGLang: --lora-paths alone turns LoRA on
        ns.enable_lora = bool(ns.lora_paths)
    if ns.lora_paths and not ns.enable_lora:
        parser.error("--lora-paths needs LoRA enabled")
    if ns.max_loras_per_batch < 1:
        parser.error("--max-loras-per-batch must be >= 1")
    args = ServerArgs(**{k: v for k, v in vars(ns).items() if not k.endswith("_ignored")})
    shown = list(argv or sys.argv[1:])
    for i, a in enumerate(shown[:-1]):
        if a in ("--api-key", "--admin-api-key"):
            shown[i + 1] = "<redacted>"
    args.launch_command = " ".join([sys.executable, "-m", "servers.launch_server", *shown])
    return args
