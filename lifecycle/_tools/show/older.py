"""What ``show`` reads out of the prose of version 1-3 journals, which carry no typed evidence.

A version 4 journal holds a failure's facts as fields (``lifecycle.journal.evidence``):
``show`` renders them and parses nothing. Older journals, and the exception notes a
world test's report holds (``claims.claim``), say them only in words: the regular
expressions here read those words, and nothing else in ``show`` does. They read both
the words of versions 1-3 (``is waiting``, ``is stopped``, ``is unresponsive``) and
today's (``Kind.words``: ``hung``, ``stopped``, ``went unresponsive``).
"""

from __future__ import annotations

import re

from lifecycle._tools.show.cause import Cause, Decided, liveness_detail
from lifecycle.journal.evidence import Kind

LIVENESS = re.compile(
    r"rank (?P<rank>\d+) (?P<kind>died|is stopped|stopped|is spinning|was spinning|is waiting|hung"
    r"|is unresponsive|went unresponsive)"
    r"(?: at (?:step (?P<step>\d+), )?phase (?P<phase>\w+))?"
)
"""A liveness monitor's words in a note or error: the rank, its kind, where."""
_KINDS = {
    "died": Kind.DIED,
    "is stopped": Kind.STOPPED,
    "stopped": Kind.STOPPED,
    "is spinning": Kind.SPINNING,
    "was spinning": Kind.SPINNING,
    "is waiting": Kind.HANG,
    "hung": Kind.HANG,
}
_LAST_AT = re.compile(r"last at (?:step (?P<step>\d+), )?phase (?P<phase>\w+)")
_NO_PROGRESS = re.compile(r"no progress for (?P<age>[\d.]+) s")
_SILENT = re.compile(r"has not beaten for (?P<age>[\d.]+) s")
_PROC_STATE = re.compile(r"\(state (?P<state>\w)\)")
FIRST_NOTE = re.compile(r"^lifecycle: rank (?P<rank>\d+) failed first \([^)]*\): (?P<error>.*)$")
"""A failing rank's note naming the peer whose notice came first."""


def liveness_cause(rank: int, last_step: int | None, text: str, decided: Decided) -> Cause | None:
    """The cause a liveness monitor's words in ``text`` (a peer's note or error, of a version 1-3 journal) give for
    ``rank`` (whose last recorded step was ``last_step``), if any."""
    found = LIVENESS.search(text)
    if found is None or int(found["rank"]) != rank:
        return None
    kind = _KINDS.get(found["kind"], Kind.UNRESPONSIVE)
    step, phase = found["step"], found["phase"]
    last = _LAST_AT.search(text)
    if kind is Kind.UNRESPONSIVE and last is not None:
        step, phase = last["step"], last["phase"]
    age = _NO_PROGRESS.search(text) if kind is not Kind.UNRESPONSIVE else _SILENT.search(text)
    state = _PROC_STATE.search(text)
    detail = liveness_detail(
        kind,
        state=state["state"] if state else "",
        silent=age["age"] if age is not None else ("" if kind is not Kind.UNRESPONSIVE else "?"),
        killed="stacks are in" in text,
    )
    return Cause(rank, kind.value, phase or "", int(step) if step is not None else None, last_step, detail, decided)
