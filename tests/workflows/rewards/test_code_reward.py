import time

import pytest

from tests.support.wf_procs import sandbox_processes
from workflows.rewards.code import code_reward, extract_code

TESTS = [{"input": "3\n", "output": "9"}, {"input": "5\n", "output": "25"}, {"input": "-2\n", "output": "4"}]


def test_extract_code_takes_last_block():
    text = "first\n```python\nprint(1)\n```\nthen\n```py\nprint(2)\n```"
    assert extract_code(text).strip() == "print(2)"
    assert extract_code("no code here") is None


@pytest.mark.integration  # runs the sandbox
def test_correct_partial_and_wrong():
    good = "Here:\n```python\nn = int(input())\nprint(n * n)\n```"
    partial = "```python\nn = int(input())\nprint(n * n if n > 0 else 0)\n```"
    assert code_reward("p", good, tests=TESTS) == 1.0
    assert code_reward("p", partial, tests=TESTS) == pytest.approx(2 / 3)
    assert code_reward("p", "```python\nprint(0)\n```", tests=TESTS) == 0.0
    assert code_reward("p", "I cannot solve this.", tests=TESTS) == 0.0
    assert code_reward("p", "n = int(input())\nprint(n*n)", tests=TESTS, require_code_block=True) == 0.0


@pytest.mark.integration  # runs the sandbox
def test_apps_style_input_output():
    io = {"inputs": [[2, 3], [0, 0]], "outputs": [5, 0], "fn_name": "add"}
    assert code_reward("p", "```python\ndef add(a, b):\n    return a + b\n```", input_output=io) == 1.0


@pytest.mark.integration  # runs the sandbox
@pytest.mark.parametrize("body", [
    "while True:\n    pass",
    "x = []\nwhile True:\n    x.append(' ' * 10**7)",
    "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
    "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)",
    "open('/tmp/arealite-code-reward-escape', 'w').write('x')",
])
def test_hostile_programs_score_zero_quickly(body):
    t0 = time.monotonic()
    r = code_reward("p", f"```python\n{body}\nprint(int(input()) ** 2)\n```", tests=TESTS[:1],
                    timeout_per_test=1.0)
    assert r == 0.0 and time.monotonic() - t0 < 8


def test_missing_tests_is_an_error():
    with pytest.raises(ValueError, match="tests"):
        code_reward("p", "print(1)")


@pytest.mark.integration  # runs the sandbox
def test_code_reward_in_the_pool_and_a_killed_worker_leaves_nothing(reward_pool_session):
    import asyncio
    import functools

    from arealite.api.reward_api import reward_stats
    from workflows.reward_pool import compute_reward

    good = "```python\nn = int(input())\nprint(n * n)\n```"
    r = asyncio.run(compute_reward(code_reward, "p", good, [], [], {"tests": TESTS}, timeout=60))
    assert r == 1.0
    # the pool's timeout (1 s) is shorter than the sandbox's (20 s): the worker is killed
    # mid-run, and the sandbox (which dies with its parent) must not survive it
    slow = functools.partial(code_reward, timeout_per_test=20.0)
    before = reward_stats()["timeouts"]
    loop = "```python\nwhile True:\n    pass\n```"
    r = asyncio.run(compute_reward(slow, "p", loop, [], [], {"tests": TESTS[:1]}, timeout=1.0,
                                   on_failure="zero"))
    assert r == 0.0 and reward_stats()["timeouts"] == before + 1
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        left = sandbox_processes()
        if not left:
            break
        time.sleep(0.1)
    assert not left, "sandbox processes survived their killed reward worker"
    import workflows.sandbox as sbx

    sbx._last_sweep = float("-inf")  # the killed worker could not remove its working directory
    sbx._sweep_stale_workdirs()
