"""The cause's words: how the verdict names the rank whose failure came first, or says it is unknown.

``Decided`` says how the cause was found; ``Cause`` is the cause in plain words
(``rank 1 died in the training step at step 80 (killed: ...)``), rendered from a
failure's typed facts (``lifecycle.journal.evidence``: its ``Kind`` and ``Evidence``,
whose words every view shares); ``compact``, ``ranks_text`` and ``kind_of`` spell ranks
and errors. A version 4 journal's facts are read as they are; the prose of older
journals is read in ``lifecycle._tools.show.older``. The rule that picks the cause is
``lifecycle._tools.show.verdict.find_cause``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from itertools import groupby

from lifecycle.journal import Verdict
from lifecycle.journal.evidence import LIVENESS_KINDS, Evidence, Kind

Move = tuple[str, str, str]
"""One step of a rank's path: (source, trigger, dest)."""


class Decided(Enum):
    """How the verdict found the cause: the rank whose failure came first."""

    NO_FAILURE = "no rank failed"
    BY_SEQUENCE = "first in the store's order of failure notices"
    BY_NOTICE = "named by its peers' failure notices"
    BY_VERDICT = "named by its liveness monitor's verdict, in its journal (the store did not number it)"
    BY_CONSEQUENCE = "no failure notice of its own: its peers' connection errors are consequences of its death"
    BY_WALL_TIME = "by wall time, a fallback: no failure notice was journaled (hosts' clocks may differ)"
    UNKNOWN = (
        "every failure journaled is a consequence of another's (a broken connection, a timed-out receive, a"
        " launcher's stop)"
    )


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

FAILED = "failed"
"""A cause's kind when its failure's kind is not known (an older journal's error of no known kind)."""

UNNAMED_HINT = (
    "a liveness monitor names a rank behind its peers (LivenessConfig), and each rank's Python stacks"
    " (py-spy dump, faulthandler) show where it waited"
)
"""What would name the rank an unknown cause leaves unnamed."""


@dataclass(frozen=True, slots=True)
class Cause:
    """The cause of an attempt: the rank whose failure came first, what kind, where, and how it was found.

    ``rank`` is None when no rank can be named (``Decided.UNKNOWN``): ``victim`` is then
    the rank whose consequence came first, and the words say so. ``kind`` is a ``Kind``
    value, or ``FAILED``; ``phase`` a phase name (``step``, ``batch``) or ``state
    <name>``; ``step`` the step it failed at (None: unknown, ``after`` the last it
    recorded); ``detail`` the error or the evidence, in words.
    """

    rank: int | None
    kind: str
    phase: str
    step: int | None
    after: int | None
    detail: str
    decided: Decided
    victim: int | None = None

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

    def verb(self) -> str:
        """The kind's words (``Kind.words``: ``hung``, ``was spinning``), ``failed`` for a kind not known."""
        known = Kind.named(self.kind)
        return known.words if known is not None else FAILED

    def words(self) -> str:
        """The cause in plain words: ``rank 1 died in the training step at step 80 (killed: no end record, ...)``;
        unknown: ``unknown: rank 0 timed out waiting for a peer in the training step; the rank it waited on was
        not named``."""
        where = self.where()
        if self.rank is None:
            head = f"unknown: rank {self.victim} {self.verb()}" + (f" {where}" if where else "")
            return f"{head}; the rank it waited on was not named ({self.detail})"
        head = f"rank {self.rank} {self.verb()}" + (f" {where}" if where else "")
        if self.kind in (Kind.RAISED.value, FAILED):
            return f"{head}: {self.detail}"
        return f"{head} ({self.detail})"

    def line(self) -> str:
        """The verdict's first line: the cause's words, then how it was found."""
        if self.rank is None:
            return f"{self.words()} — the cause is unknown: {self.decided.value}; {UNNAMED_HINT}"
        return f"{self.words()} — the cause, {self.decided.value}"


def liveness_detail(kind: Kind, *, state: str, silent: str, killed: bool, collective: str = "") -> str:
    """A liveness verdict's evidence in words (``Kind.detail``: ``kind``; its ``/proc`` ``state``; ``silent``:
    seconds without progress, as text; ``killed``: its monitor killed it; ``collective``: the one it did not enter,
    with its group), as every version's reading says it."""
    judged = "killed by its liveness monitor" if killed else "named by its liveness monitor"
    return kind.detail(state=state, silent=silent, judged=judged, collective=collective) or judged


def from_evidence(facts: Evidence, last_step: int | None, decided: Decided, *, killed: bool, error: str = "") -> Cause:
    """The cause a failure's typed ``facts`` give (a version 4 verdict or notice): no text is parsed.

    ``last_step``: the last step the rank recorded; ``killed``: its monitor killed it;
    ``error``: its error, the detail of a kind no liveness monitor names.
    """
    kind = Kind.named(facts.kind)
    silent = f"{facts.silent_s:.1f}" if facts.silent_s is not None else "?"
    if kind is None or kind not in LIVENESS_KINDS:
        detail = error or (kind.words if kind is not None else facts.kind)
    else:
        collective = ""
        if facts.collective:
            waiting = ""
            if facts.peers and kind is Kind.STUCK_OUTSIDE:
                waiting = f" (rank(s) {', '.join(map(str, facts.peers))} waiting)"
            collective = f"{facts.collective} of {facts.group}{waiting}"
        detail = liveness_detail(kind, state=facts.process_state, silent=silent, killed=killed, collective=collective)
        if facts.sites:
            detail += f"; called: {facts.sites}"
    return Cause(facts.rank, facts.kind, facts.phase, facts.step, last_step, detail, decided)


KILLED = "killed by its liveness monitor"
"""The last place on the path of a rank its own liveness monitor killed (no state of the session: it was killed)."""
KILLED_TRIGGER = "killed_by_monitor"
"""The step onto ``KILLED`` (no trigger of the session's table: the diagrams draw none for it)."""


def killed_by_monitor(verdict: Verdict) -> bool:
    """Whether the monitor that wrote ``verdict`` killed its culprit: ``killed`` (version 4), or, in an older
    journal, the stacks it had dumped (written only before a kill)."""
    return verdict.killed or bool(verdict.stacks)


def killed_path(moves: Sequence[tuple[str, str, str]], records: Iterable[object], rank: int) -> tuple[Move, ...]:
    """``rank``'s path (``moves``: source, trigger, dest), ending at ``KILLED`` when a verdict in its ``records``
    says its own monitor killed it before it reached a final state."""
    final = bool(moves) and moves[-1][2] in ("closed", "failed")
    if not final and any(isinstance(r, Verdict) and r.culprit == rank and killed_by_monitor(r) for r in records):
        return (*moves, (moves[-1][2] if moves else "uninitialized", KILLED_TRIGGER, KILLED))
    return tuple(moves)


def unknown(victim: int, kind: str, phase: str, step: int | None, after: int | None, error: str) -> Cause:
    """The cause when every failure is a consequence: unknown, said from the first one seen (``victim``'s, of
    ``kind``, in ``phase`` at ``step`` or ``after`` its last, with ``error``)."""
    return Cause(None, kind, phase, step, after, error, Decided.UNKNOWN, victim)


def quoted_error(note: str) -> str:
    """The first rank's error as a note quotes it (``lifecycle: rank R failed first (...): error``); the note itself
    otherwise. Text is split, not parsed: the error is whatever follows the parenthesis."""
    head, _, error = note.partition("): ")
    return error if head.startswith("lifecycle: rank ") and error else note.removeprefix("lifecycle: ")


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


def kind_of(error: str) -> str:
    """What errors that differ only in their numbers (ports, pids, ranks, addresses) share."""
    return "".join("#" if digits else "".join(chars) for digits, chars in groupby(error, str.isdigit))
