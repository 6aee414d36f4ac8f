"""What a session tells its observers, and its journal of transitions: plain records, no behaviour."""

from __future__ import annotations

from dataclasses import dataclass

from lifecycle._core.executor import StepRecord
from lifecycle._core.plans import Outcome
from lifecycle._core.seams import Announcement
from lifecycle._core.states import State, Trigger

__all__ = ["FailureEvent", "JournalEntry", "ReclaimEvent", "SessionEvent", "TeardownEvent", "TransitionEvent"]


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One transition taken: from, to, by which trigger, when (monotonic s) and how long it took."""

    source: State
    dest: State
    trigger: Trigger
    at: float
    duration_s: float
    detail: str = ""


@dataclass(frozen=True, slots=True)
class TransitionEvent:
    """A transition just taken (``entry``); its work ran from ``start`` to ``end`` (wall-clock, ``time.time()``)."""

    entry: JournalEntry
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class TeardownEvent:
    """A step of a teardown plan of ``outcome`` just ran (``record``); from ``start`` to ``end``, wall-clock seconds."""

    outcome: Outcome
    record: StepRecord
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class ReclaimEvent:
    """Before acquiring a kind, the session released what an earlier session left of it.

    ``left_by`` names that session; ``record`` is the release step that ran (its error, if any).
    """

    left_by: str
    record: StepRecord


@dataclass(frozen=True, slots=True)
class FailureEvent:
    """The session is taking its failure edge because of ``error`` (``"Type: message"``), before releasing anything.

    ``time``: when (wall clock). ``phase`` and ``step``: where the caller said it was
    (``Session.progress``), else the state's name and None. ``announcement``: what came
    of telling the other ranks (``AnnouncesFailures``); actions that cannot tell them
    give one with ``seq`` None and ``unpublished`` saying so. ``kind``: what the failure
    is (a ``lifecycle.journal.evidence.Kind`` value; ``raised`` unless known otherwise).
    """

    phase: str
    step: int | None
    error: str
    time: float
    announcement: Announcement
    kind: str = "raised"


SessionEvent = TransitionEvent | TeardownEvent | ReclaimEvent | FailureEvent
"""What a session observer is called with (see ``Session.add_observer``)."""
