import asyncio
import functools
import time

import numpy as np
import pytest

from arealite.api.reward_api import (
    RewardFailed,
    as_reward,
    check_reward_fn,
    inline_reward,
    reset_reward_stats,
    reward_stats,
)
from tests.support import wf_reward_helpers as H
from workflows.reward_pool import RewardPool, compute_reward


@pytest.fixture(scope="module")
def pool():
    p = RewardPool(n_workers=2)
    yield p
    p.shutdown()


def _delta(before, after):
    return {k: after[k] - before[k] for k in after}


@pytest.mark.integration  # worker processes
def test_pool_runs_reward_with_row_kwargs(pool):
    row = {"answer": "#### 4", "id": 7}
    assert pool.call(H.echo_row_reward, ("p", "c", [1, 2, 3], [4, 5]), row, timeout=30) == 1.0
    assert pool.call(H.const_reward, ("p", "c", [], []), {"value": 2.5}, timeout=30) == 2.5


@pytest.mark.integration  # worker processes
def test_exception_fails_the_call_and_is_counted(pool):
    before = reward_stats()
    assert pool.call(H.raising_reward, ("p", "c", [], []), {}, timeout=30) is None
    assert pool.call(H.nan_reward, ("p", "c", [], []), {}, timeout=30) is None
    assert pool.call(H.string_reward, ("p", "c", [], []), {}, timeout=30) is None
    d = _delta(before, reward_stats())
    assert d["errors"] == 3 and d["calls"] == 3 and d["ok"] == 0
    # the worker survived an exception: the next call works
    assert pool.call(H.const_reward, ("p", "c", [], []), {}, timeout=30) == 0.5


@pytest.mark.integration  # worker processes
def test_timeout_kills_worker_and_pool_recovers(pool):
    pool.call(H.const_reward, ("p", "c", [], []), {}, timeout=30)  # warm: load is not timed
    before = reward_stats()
    t0 = time.monotonic()
    r = pool.call(H.sleeping_reward, ("p", "c", [], []), {"seconds": 60}, timeout=1.0)
    assert r is None and time.monotonic() - t0 < 10
    d = _delta(before, reward_stats())
    assert d["timeouts"] == 1
    assert pool.call(H.const_reward, ("p", "c", [], []), {"value": 1.0}, timeout=30) == 1.0


@pytest.mark.integration  # worker processes
def test_dead_worker_is_replaced(pool):
    before = reward_stats()
    assert pool.call(H.dying_reward, ("p", "c", [], []), {}, timeout=30) is None
    d = _delta(before, reward_stats())
    assert d["worker_crashes"] == 1
    assert pool.call(H.const_reward, ("p", "c", [], []), {"value": 1.0}, timeout=30) == 1.0


@pytest.mark.integration  # worker processes
def test_calls_run_in_other_processes_concurrently(pool):
    import os

    async def main():
        return await asyncio.gather(*(pool.acall(H.worker_pid_reward, "p", "c", [], [], timeout=30)
                                      for _ in range(6)))

    pids = asyncio.run(main())
    assert os.getpid() not in pids and len(set(pids)) <= 2


def test_partial_reward_and_unpicklable_reward():
    check_reward_fn(functools.partial(H.const_reward, value=3.0))
    with pytest.raises(TypeError, match="module level"):
        check_reward_fn(lambda *a, **k: 1.0)
    with pytest.raises(TypeError, match="callable"):
        check_reward_fn(3)


def test_inline_reward_runs_on_caller_and_counts_errors():
    @inline_reward
    def boom(prompt, completion, prompt_ids, completion_ids, **row):
        raise KeyError("x")

    @inline_reward
    def ok(prompt, completion, prompt_ids, completion_ids, **row):
        return len(completion)

    check_reward_fn(boom)  # inline rewards need not be picklable
    reset_reward_stats()
    row = {"prompt": "collides", "answer": 1}  # a row key named like an argument is dropped
    assert asyncio.run(compute_reward(ok, "p", "abc", [1], [2], row, timeout=1)) == 3.0
    with pytest.raises(RewardFailed, match="rejected"):  # by default a failed reward rejects
        asyncio.run(compute_reward(boom, "p", "abc", [1], [2], row, timeout=1))
    zero = compute_reward(boom, "p", "abc", [1], [2], row, timeout=1, on_failure="zero")
    assert asyncio.run(zero) == 0.0
    s = reward_stats()
    assert s["inline"] == 3 and s["errors"] == 2 and s["ok"] == 1
    with pytest.raises(ValueError, match="reward_failure"):
        asyncio.run(compute_reward(ok, "p", "abc", [1], [2], row, timeout=1, on_failure="skip"))


def test_a_reward_that_returns_no_number_rejects_its_episode(caplog):
    """#37: "1.0" (a string) was silently taken as 1.0; now it rejects the episode and the
    warning says what came back."""
    @inline_reward
    def text(prompt, completion, prompt_ids, completion_ids, **row):
        return "1.0"

    with pytest.raises(RewardFailed, match="rejected"):
        asyncio.run(compute_reward(text, "p", "c", [1], [2], {}, timeout=1))
    assert "returned str '1.0', not a number" in caplog.text
    assert as_reward(1) == 1.0 and as_reward(np.float32(0.5)) == 0.5 and as_reward(True) == 1.0
    for bad in ("1.0", None, [1.0], b"1"):
        with pytest.raises(TypeError, match="not a number"):
            as_reward(bad)
    with pytest.raises(ValueError, match="NaN"):
        as_reward(float("nan"))


def test_fork_start_method_refused():
    with pytest.raises(ValueError, match="fork"):
        RewardPool(1, "fork")
