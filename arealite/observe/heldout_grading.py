"""The plain functions of the held-out evaluation (``observe/heldout_eval.py``): where a reply's
answer stands, what it is worth against the gold, how the replies are spread, pass@k.

Why a lenient extraction at all: the reward pays for the answer *in the required format*
(``exact``); a model can know the answer and say it in a restatement (``3 + 4 = 7``) or a tag the
reward does not read. ``answer_span`` finds the last answer-shaped span of a reply (inside the
last ``<answer>...</answer>`` when there is one; the last number when the gold is a number; else
the last line, lead-ins such as ``Answer:`` stripped), so the task's own checker can be asked
about the answer alone (``right``), apart from the format (``format``).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\d])")
ANSWER_TAG = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.S | re.I)
ANY_TAG = re.compile(r"</?\w+>")
LEAD_IN = re.compile(r"^\s*(?:the\s+)?(?:final\s+)?answer\s*(?:is|:)?\s*[:=]?\s*", re.I)
GOLD_MARK = re.compile(r"^[\s#]*")  # GSM8K's "#### N": the marks before a gold number

Span = tuple[str, int, int]  # (text, start, end) in the string it was found in


def is_number(text: str) -> bool:
    m = NUMBER.fullmatch(text.strip())
    return m is not None


def to_number(text: str) -> Fraction | None:
    try:
        return Fraction(text.strip().replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def gold_span(gold: str) -> Span | None:
    """The answer inside a dataset's answer field: the whole of it, less GSM8K's ``####``
    marks and answer tags (``"#### 64"`` -> ``"64"``); None for an empty field."""
    inner = ANSWER_TAG.search(gold)
    lo, hi = (inner.start(1), inner.end(1)) if inner else (0, len(gold))
    lo += len(GOLD_MARK.match(gold[lo:hi]).group(0))
    while hi > lo and gold[hi - 1].isspace():
        hi -= 1
    return (gold[lo:hi], lo, hi) if hi > lo else None


def answer_span(reply: str, numeric: bool) -> Span | None:
    """The last answer-shaped span of ``reply`` (None: there is none): inside the last
    ``<answer>`` block when there is one (an unclosed one runs to the end); the last number
    when the gold is a number (``numeric``), so a restatement ``3 + 4 = 7`` gives ``7``; else
    the last non-empty line with tags, an ``Answer:`` lead-in and a final period stripped."""
    blocks = list(ANSWER_TAG.finditer(reply))
    lo, hi = (blocks[-1].start(1), blocks[-1].end(1)) if blocks else (0, len(reply))
    if numeric:
        nums = list(NUMBER.finditer(reply, lo, hi))
        if not nums:
            return None
        m = nums[-1]
        return m.group(0), m.start(), m.end()
    region = reply[lo:hi]
    for line_match in reversed(list(re.finditer(r"[^\n]+", region))):
        s, e = lo + line_match.start(), lo + line_match.end()
        # tags inside the line are blanked (same length), so positions stay those of ``reply``
        text = ANY_TAG.sub(lambda t: " " * len(t.group(0)), reply[s:e])
        s += len(text) - len(text.lstrip())
        text = text.strip()
        lead = LEAD_IN.match(text)
        if lead and lead.end() < len(text):
            s, text = s + lead.end(), text[lead.end():]
        text = text.rstrip(".").rstrip()
        if text:
            return text, s, s + len(text)
    return None


def substitute(text: str, span: Span, value: str) -> str:
    """``text`` with ``span`` replaced by ``value``."""
    return text[: span[1]] + value + text[span[2]:]


def normalize(answer: str | None) -> str | None:
    """The form answers are compared and counted in: a number's exact value, else the text
    case-folded with its spaces collapsed."""
    if answer is None:
        return None
    if is_number(answer):
        n = to_number(answer)
        if n is not None:
            return str(n)
    return " ".join(answer.split()).casefold()


def majority_share(answers: Sequence[str | None]) -> tuple[float, str | None]:
    """Share of all ``answers`` that give the single most common one (None, no answer, is never
    that answer) and the answer itself; (0.0, None) when there are none."""
    if not answers:
        return 0.0, None
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return 0.0, None
    top, n = counts.most_common(1)[0]
    return n / len(answers), top


def is_collapse(model_share: float, gold_share: float) -> bool:
    """The policy gives one answer far more often than the gold answers do: more than twice the
    gold's majority share and more than half of all replies."""
    return model_share > 2 * gold_share and model_share > 0.5


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are right: the chance that ``k`` of
    them, drawn without replacement, hold at least one right one, 1 - C(n-c, k) / C(n, k),
    as a product (no huge binomials)."""
    if not 0 <= c <= n or k < 1 or k > n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


# What the reward pays a completion for this row (None: the reward function failed on it).
Pays = Callable[[str], "float | None"]
# Forms the gold answer is tried in to find one the reward pays in full: the field itself, the
# reasoning-gym tag closed after a prefilled ``<answer>``, the whole tag, GSM8K's marks.
GOLD_FORMS = ("{gold}", "{core}</answer>", "<answer>{core}</answer>", "#### {core}")


Template = tuple[str, int, int]  # (a whole completion, start and end of the answer in it)


def gold_template(gold: str, pays: Pays, full_credit: float) -> Template | None:
    """A completion the reward pays in full for the gold answer, with the answer's place in it
    (the candidate answers are put there to ask the task's own checker): the first of
    ``GOLD_FORMS`` that is paid; None when none is (``right`` then compares answers)."""
    core = gold_span(gold)
    if core is None:
        return None
    for form in GOLD_FORMS:
        text = gold if form == "{gold}" else form.format(core=core[0])
        at = core[1] if form == "{gold}" else form.index("{core}")
        r = pays(text)
        if r is not None and r >= full_credit:
            return text, at, at + len(core[0])
    return None


@dataclass(frozen=True)
class Graded:
    """One reply against its gold: its answer (``normalize``d; None: none found), ``right``
    (the answer is right wherever it stands), ``exact`` (the reward pays it in full: right
    and in the required format), ``format`` (the reply would be paid in full were its answer
    the gold one) and ``score`` (what the reward paid)."""

    answer: str | None
    right: bool
    exact: bool
    format: bool
    score: float


def grade(reply: str, gold: str, score: float, pays: Pays, full_credit: float,
          template: Template | None) -> Graded:
    """Grade ``reply`` (paid ``score`` by the reward) against the dataset's ``gold`` answer.
    ``template``: ``gold_template``'s for this row."""
    core = gold_span(gold)
    numeric = core is not None and is_number(core[0])
    span = answer_span(reply, numeric)
    exact = score >= full_credit
    right = fmt = exact
    if span is not None and core is not None and not exact:
        if template is not None:
            r = pays(substitute(template[0], template, span[0]))
            right = r is not None and r >= full_credit
        else:
            right = normalize(span[0]) == normalize(core[0])
        r = pays(substitute(reply, span, core[0]))
        fmt = r is not None and r >= full_credit
    return Graded(normalize(span[0]) if span else None, right, exact, fmt, float(score))


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan
