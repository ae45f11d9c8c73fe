"""A child's tracebacks on the console (#37): one line each, torchrun's repeat of a worker's
failure not at all, the fatal one left to the launcher's exit line."""

from __future__ import annotations

from arealite.launcher.error_lines import TracebackFilter

WORKER = """starting
Traceback (most recent call last):
  File "/tmp/boom.py", line 4, in f
    raise ValueError("the reward table is empty")
ValueError: the reward table is empty

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/tmp/boom.py", line 8, in <module>
    raise RuntimeError("step 3 failed") from e
RuntimeError: step 3 failed"""

TORCHRUN = """E1127 19:09:25.632000 20720 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 0
Traceback (most recent call last):
  File "/venv/bin/torchrun", line 6, in <module>
    sys.exit(main())
             ^^^^^^
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
boom FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  exitcode  : 1 (pid: 20770)
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================"""


def _feed(f: TracebackFilter, text: str) -> list[str]:
    return [shown for line in text.splitlines() for shown in f.feed(line)]


def test_a_fatal_chain_and_torchruns_summary_are_left_to_the_exit_line():
    f = TracebackFilter("logs/trainer.log")
    assert _feed(f, WORKER + "\n" + TORCHRUN) == ["starting"]
    assert f.what_failed() == "RuntimeError: step 3 failed"


def test_an_exception_the_process_lives_on_after_is_one_line():
    f = TracebackFilter("logs/server0.log")
    shown = _feed(f, WORKER + "\nstill serving\n====================== a rule of its own")
    assert shown == ["starting", "RuntimeError: step 3 failed (traceback in logs/server0.log)",
                     "still serving", "====================== a rule of its own"]
    assert f.what_failed() == "====================== a rule of its own"


def test_a_death_without_a_traceback_names_the_last_line():
    f = TracebackFilter("logs/trainer.log")
    assert _feed(f, "boom: trainer rank 0 cannot continue\n" + TORCHRUN) == [
        "boom: trainer rank 0 cannot continue"]
    assert f.what_failed() == "boom: trainer rank 0 cannot continue"
    assert TracebackFilter("x").what_failed() == "(no output)"


def test_rank_prefixes_are_understood():
    f = TracebackFilter("t.log")
    text = "\n".join(f"[rank1]: {line}" for line in WORKER.splitlines())
    assert _feed(f, text) == ["[rank1]: starting"]
    assert f.what_failed() == "RuntimeError: step 3 failed"
