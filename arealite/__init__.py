"""arealite: asynchronous RL for LLMs."""

__version__ = "0.1.0"
