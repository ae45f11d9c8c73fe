"""A child's tracebacks, said once: the console gets one line per exception the process lives
on after (``ValueError: ... (traceback in logs/trainer.log)``) while the log file keeps every
line; torchrun's own wrapper traceback and its ``ChildFailedError`` summary, which repeat a
worker's failure, stay in the log alone. The exception that ends the process is not streamed:
the launcher names it (``what_failed``) in its one line about the exit.
"""

from __future__ import annotations

import re

TRACEBACK = "Traceback (most recent call last):"
# what joins two tracebacks of one chain
_CHAIN = ("The above exception was the direct cause of the following exception:",
          "During handling of the above exception, another exception occurred:")
_RANK = re.compile(r"^\[(?:rank|default)\d+\]:\s?")  # torchrun's per-rank prefix, when on
_ELASTIC_LOG = re.compile(r"^[EWI]\d{4} .*torch/distributed/elastic/")
_RULE = re.compile(r"^={20,}$")
# torchrun's wrapper error: the worker's own error, already said, is the one to report
_WRAPPER = re.compile(r"(^|\.)(ChildFailedError|SignalException)\b")


class TracebackFilter:
    """Feed a child's lines in order; ``feed`` returns what the console shows (None: log only)."""

    def __init__(self, log_name: str) -> None:
        self.log_name = log_name
        self.last_error: str | None = None  # the last exception line (not torchrun's wrapper)
        self.last_line: str | None = None  # the last line shown, for a death without traceback
        self._in_tb = False
        self._pending: str | None = None  # an exception line, shown once its chain has ended
        self._summary = False  # inside torchrun's ==== summary block (after its wrapper error)
        self._after_wrapper = False
        self._error_last = False  # the last thing said was an exception, not a plain line

    def feed(self, line: str) -> list[str]:
        text = _RANK.sub("", line)
        out: list[str] = []
        if self._summary:
            if _RULE.match(text.strip()):
                self._summary = False  # its closing rule
            return out
        if self._in_tb:
            if not text.strip() or text[:1].isspace():
                return out  # frames and source lines
            self._in_tb = False
            self._pending = text.strip()  # the exception line
            self._after_wrapper = bool(_WRAPPER.search(self._pending.split(":")[0]))
            if not self._after_wrapper:
                self.last_error, self._error_last = self._pending, True
            return out
        if self._pending is not None and (not text.strip() or text.strip() in _CHAIN):
            return out  # the chain may go on
        if text.startswith(TRACEBACK):
            self._in_tb = True
            return out
        if _ELASTIC_LOG.match(text):
            return out
        after_wrapper, self._after_wrapper = self._after_wrapper, False
        if after_wrapper and _RULE.match(text.strip()):
            self._summary = True
            return out
        # real output follows: the process lived on after its exception, so say it now (an
        # exception that ends the process is said by the launcher, once, with the exit)
        out += self._flush()
        out.append(line)
        if line.strip():
            self.last_line, self._error_last = line.strip(), False
        return out

    def what_failed(self) -> str:
        """The error to name when the process has failed: its last exception, else its last
        line."""
        if self._error_last or self.last_line is None:
            return self.last_error or "(no output)"
        return self.last_line

    def _flush(self) -> list[str]:
        pending, self._pending = self._pending, None
        if pending is None or _WRAPPER.search(pending.split(":")[0]):
            return []
        return [f"{pending} (traceback in {self.log_name})"]
