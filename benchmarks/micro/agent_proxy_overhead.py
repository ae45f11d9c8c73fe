"""Agent proxy overhead: latency per call through the proxy's in-process ``AsyncOpenAI`` client
versus a direct ``RemoteInferenceEngine.agenerate`` of the same prompt, against one embedded
server on the tiny model (a separate process).

Both paths generate the same tokens (greedy, ``ignore_eos``, ``--tokens`` new tokens) from the
same conversation; they alternate call by call on one event loop, so load on the shared
machine hits both alike. The proxy adds: the OpenAI client (request building, httpx2 over an
ASGI transport, response parsing into pydantic models), message checks, rendering the chat
template and tokenizing, recording the turn, detokenizing and tool-call parsing.

    python -m benchmarks.micro.agent_proxy_overhead [--quick] [--calls N] [--tokens T]

Prints the median latency of each path, the ratio proxy/direct, and the overhead in ms.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from arealite.api.config.rollout import GenerationHyperparameters, InferenceEngineConfig
from arealite.api.io_struct import ModelRequest


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer calls (smoke run)")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--tokens", type=int, default=8)
    args = p.parse_args(argv)
    calls = 30 if args.quick else args.calls

    from transformers import AutoTokenizer

    from arealite.agent.proxy import AgentProxy
    from arealite.demo.tiny import TinyModelSpec, build_tiny_model
    from arealite.demo.toy_tools import TOOLS
    from arealite.rollout.remote_engine import RemoteInferenceEngine
    from benchmarks.harness.server_process import Server

    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "model", TinyModelSpec(corpus="toy_tools"))
        tok = AutoTokenizer.from_pretrained(str(model))
        with Server(str(model)) as server:
            addr = server.addr
            eng = RemoteInferenceEngine(InferenceEngineConfig(setup_timeout=60, request_timeout=120))
            eng.initialize([addr])
            g = GenerationHyperparameters(max_new_tokens=args.tokens, greedy=True,
                                          temperature=0.0, ignore_eos=True)
            proxy = AgentProxy(eng, tok, g)
            messages = [{"role": "user", "content": "What is 47 * 8?"}]
            ids = tok.encode(tok.apply_chat_template(messages, tools=TOOLS, tokenize=False,
                                                     add_generation_prompt=True),
                             add_special_tokens=False)

            async def bench() -> tuple[list[float], list[float]]:
                direct, via = [], []
                session = proxy.start_session()
                client = proxy.client(session)
                for i in range(calls + 5):
                    t0 = time.perf_counter()
                    await eng.agenerate(ModelRequest(input_ids=list(ids), gconfig=g))
                    t1 = time.perf_counter()
                    await client.chat.completions.create(model="p", messages=messages, tools=TOOLS)
                    t2 = time.perf_counter()
                    if i >= 5:  # warm-up
                        direct.append(t1 - t0)
                        via.append(t2 - t1)
                await client.close()
                return direct, via

            direct, via = eng.executor.run_coroutine(bench()).result(1800)
            eng.destroy()
    d, v = statistics.median(direct), statistics.median(via)
    print(f"agent_proxy_overhead: {calls} calls, {args.tokens} new tokens each, one tiny-model "
          "embedded server")
    print(f"  direct agenerate   median {d * 1e3:8.2f} ms/call")
    print(f"  through the proxy  median {v * 1e3:8.2f} ms/call")
    print(f"  ratio proxy/direct {v / d:.2f}   overhead {(v - d) * 1e3:.2f} ms/call")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
