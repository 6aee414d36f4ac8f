"""The cause's words: how the verdict names the rank whose failure came first, and what it reads in errors.

``Decided`` says how the cause was found; ``Cause`` is the cause in plain words
(``rank 1 died in the training step at step 80 (killed: ...)``); ``consequence_error``
tells a broken connection (a consequence of a peer's failure, never a cause);
``liveness_cause`` reads a liveness monitor's verdict out of a notice or an error;
``compact``, ``ranks_text`` and ``kind_of`` spell ranks and errors. The rule that picks the
cause is ``lifecycle._tools.verdict.find_cause``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum

VERDICT_ERROR = "LivenessVerdict: "
"""How the error of a liveness monitor's failure notice begins (``lifecycle._torch.notice.VERDICT_ERROR``)."""


class Decided(Enum):
    """How the verdict found the cause: the rank whose failure came first."""

    NO_FAILURE = "no rank failed"
    BY_SEQUENCE = "first in the store's order of failure notices"
    BY_NOTICE = "named by its peers' failure notices"
    BY_VERDICT = "named by its liveness monitor's verdict, in its journal (the store did not number it)"
    BY_CONSEQUENCE = "no failure notice of its own: its peers' connection errors are consequences of its death"
    BY_WALL_TIME = "by wall time, a fallback: no failure notice was journaled (hosts' clocks may differ)"


CONNECTION = re.compile(
    r"connection (?:reset|closed|refused|lost)|closed by peer|broken pipe|read error|write error|ECONNRESET|EPIPE"
    r"|socket (?:timeout|closed)|timed out waiting|the store is gone|is unreachable|^StoppedByLauncher:",
    re.IGNORECASE,
)
"""What a peer's error says when its connection to a rank that failed broke, a receive from it timed out, or the
launcher stopped it after that rank's death (``StoppedByLauncher``): a consequence, never a cause."""


def consequence_error(error: str) -> bool:
    """Whether ``error`` is a broken connection (reset, closed by peer, ...): the mark of a peer's failure."""
    return CONNECTION.search(error) is not None


LIVENESS = re.compile(
    r"rank (?P<rank>\d+) (?P<kind>died|is stopped|is spinning|is waiting|is unresponsive)"
    r"(?: at (?:step (?P<step>\d+), )?phase (?P<phase>\w+))?"
)
_LAST_AT = re.compile(r"last at (?:step (?P<step>\d+), )?phase (?P<phase>\w+)")
_NO_PROGRESS = re.compile(r"no progress for (?P<age>[\d.]+) s")
_SILENT = re.compile(r"has not beaten for (?P<age>[\d.]+) s")
_PROC_STATE = re.compile(r"\(state (?P<state>\w)\)")
FIRST_NOTE = re.compile(r"^lifecycle: rank (?P<rank>\d+) failed first \([^)]*\): (?P<error>.*)$")

PHASE_WORDS = {
    "batch": "in the batch provider",
    "step": "in the training step",
    "eval": "in an evaluation",
    "checkpoint": "in a checkpoint save",
    "callback": "in a step callback",
    "finalize": "in finalize",
    "setup": "in setup",
    "dist": "in init_distributed",
    "globals": "in init_globals",
}
"""How the cause's line says a phase (``Session.progress``'s and the failure notice's names)."""

KINDS = ("raised", "died", "stopped", "hung", "spinning", "unresponsive", "failed")
"""The kinds of cause the first line names: an exception, a death, a stop, a hang, a spin, a silent host, other."""


@dataclass(frozen=True, slots=True)
class Cause:
    """The cause of an attempt: the rank whose failure came first, what kind, where, and how it was found.

    ``kind`` is one of ``KINDS``; ``phase`` a phase name (``step``, ``batch``) or ``state
    <name>``; ``step`` the step it failed at (None: unknown, ``after`` the last it
    recorded); ``detail`` the error or the liveness monitor's evidence.
    """

    rank: int
    kind: str
    phase: str
    step: int | None
    after: int | None
    detail: str
    decided: Decided

    def where(self) -> str:
        """``in the training step at step 50``, ``in state training after step 49``."""
        if self.phase.startswith("state "):
            place = f"in {self.phase}"
        else:
            place = PHASE_WORDS.get(self.phase, f"in phase {self.phase}") if self.phase else ""
        if self.step is not None:
            at = f"at step {self.step}"
        elif self.after is not None:
            at = f"after step {self.after}"
        else:
            at = ""
        return " ".join(part for part in (place, at) if part)

    def words(self) -> str:
        """The cause in plain words: ``rank 1 died in the training step at step 80 (killed: no end record, ...)``."""
        verb = {"spinning": "was spinning", "unresponsive": "went silent"}.get(self.kind, self.kind)
        where = self.where()
        head = f"rank {self.rank} {verb}" + (f" {where}" if where else "")
        if self.kind in ("raised", "failed"):
            return f"{head}: {self.detail}"
        return f"{head} ({self.detail})"

    def line(self) -> str:
        """The verdict's first line: the cause's words, then how it was found."""
        return f"{self.words()} — the cause, {self.decided.value}"


def liveness_cause(rank: int, last_step: int | None, text: str, decided: Decided) -> Cause | None:
    """The cause a liveness monitor's words in ``text`` (a peer's note or error) give for ``rank`` (whose last
    recorded step was ``last_step``), if any."""
    found = LIVENESS.search(text)
    if found is None or int(found["rank"]) != rank:
        return None
    kind = {"died": "died", "is stopped": "stopped", "is spinning": "spinning", "is waiting": "hung"}.get(
        found["kind"], "unresponsive"
    )
    step, phase = found["step"], found["phase"]
    last = _LAST_AT.search(text)
    if kind == "unresponsive" and last is not None:
        step, phase = last["step"], last["phase"]
    age = _NO_PROGRESS.search(text)
    silent = age["age"] if age is not None else ""
    killed = "killed by its liveness monitor" if "stacks are in" in text else "named by its liveness monitor"
    if kind == "died":
        detail = "killed: no end record, its process gone, its heartbeat stopped"
    elif kind == "stopped":
        state = _PROC_STATE.search(text)
        detail = (
            f"its process stopped in state {state['state'] if state else 'T'}, no progress for {silent} s; {killed}"
        )
    elif kind == "hung":
        detail = f"alive, no progress for {silent} s while its peers went on; {killed}"
    elif kind == "spinning":
        detail = f"running, no progress for {silent} s; {killed}"
    else:
        beat = _SILENT.search(text)
        detail = f"its monitor stopped beating for {beat['age'] if beat else '?'} s: its host or monitor is gone"
    return Cause(rank, kind, phase or "", int(step) if step is not None else None, last_step, detail, decided)


def compact(ranks: Iterable[int]) -> str:
    """Ranks as compact ranges: ``0, 2-1023``."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ", ".join(parts)


def ranks_text(ranks: Sequence[int], limit: int = 80) -> str:
    """``rank 3`` or ``ranks 0, 2-1023``; ranges past ``limit`` characters are cut, the count said."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    ranges = compact(ranks)
    if len(ranges) > limit:
        ranges = ranges[:limit].rsplit(", ", 1)[0] + f", … ({len(ranks)} ranks)"
    return f"ranks {ranges}"


_NUMBER = re.compile(r"\d+")


def kind_of(error: str) -> str:
    """What errors that differ only in their numbers (ports, pids, ranks, addresses) share."""
    return _NUMBER.sub("#", error)
