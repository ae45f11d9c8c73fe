"""Inference servers speaking SGLang's HTTP protocol, their pool, and a REST gateway.

Shares nothing with `arealite` but the wire protocol (docs/protocol.md)."""
