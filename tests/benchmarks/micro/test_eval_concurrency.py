"""benchmarks/micro/eval_concurrency.py: both caps evaluate the same prompts through the RL
entry scripts' evaluation path on a real embedded server, with the same greedy results."""

from __future__ import annotations

import re

import pytest

from benchmarks.micro import eval_concurrency


def test_bad_caps_exit_2(capsys):
    for bad in (["--caps", "4,x"], ["--caps", "-1"], ["--rounds", "0"]):
        with pytest.raises(SystemExit) as e:
            eval_concurrency.main(bad)
        assert e.value.code == 2


@pytest.mark.integration
def test_quick_run_times_both_caps_with_equal_accuracies(capsys):
    assert eval_concurrency.main(["--quick", "--rounds", "2", "--caps", "2,0"]) == 0
    out = capsys.readouterr().out
    assert "prompts=64" in out and len(re.findall(r"^round \d: ", out, re.M)) == 4
    assert re.search(r"^ratio 2 in flight / all at once: \d+\.\d\dx", out, re.M)
    assert "(equal)" in out
