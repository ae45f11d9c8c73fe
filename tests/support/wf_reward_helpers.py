"""Reward functions for tests, importable by spawned reward workers (no heavy imports)."""

from __future__ import annotations

import os
import time


def const_reward(prompt, completion, prompt_ids, completion_ids, value=0.5, **row):
    return value


def length_reward(prompt, completion, prompt_ids, completion_ids, **row):
    return float(len(completion_ids))


def raising_reward(prompt, completion, prompt_ids, completion_ids, **row):
    raise RuntimeError("this reward always fails")


def sleeping_reward(prompt, completion, prompt_ids, completion_ids, seconds=60.0, **row):
    time.sleep(seconds)
    return 1.0


def dying_reward(prompt, completion, prompt_ids, completion_ids, **row):
    os._exit(3)


def nan_reward(prompt, completion, prompt_ids, completion_ids, **row):
    return float("nan")


def echo_row_reward(prompt, completion, prompt_ids, completion_ids, **row):
    """1.0 iff the row's fields and the token ids arrive intact in the worker."""
    ok = row.get("answer") == "#### 4" and row.get("id") == 7 and list(prompt_ids) == [1, 2, 3]
    return 1.0 if ok and list(completion_ids) == [4, 5] else 0.0


def worker_pid_reward(prompt, completion, prompt_ids, completion_ids, **row):
    return float(os.getpid())


def string_reward(prompt, completion, prompt_ids, completion_ids, **row):
    return "1.0"  # a number's text: a bug in the reward, never a score
