"""Compatibility alias: the inference client lives in ``arealite.rollout.remote_engine`` (the
client side); this old import path keeps working for code written against it. Nothing in the
project imports it."""

from arealite.rollout.remote_engine import GenerationError, RemoteSGLangEngine, parse_addrs

__all__ = ["GenerationError", "RemoteSGLangEngine", "parse_addrs"]
