"""A failure's evidence, defined once: its kinds, their words, the notice prefix, and the consequence rule.

Every process that says what a failure *is* reads it here: the rank's failure path
(``lifecycle._torch.notice``, ``lifecycle._training.stops``), the liveness monitor (a
standard-library process that loads this file by path, as it loads its wire client),
the journal (``lifecycle.journal``, schema version 4: a failure's ``Kind`` and
``Evidence`` are typed fields) and ``show`` (which renders them and never parses prose
from a version 4 journal).

- ``Kind``: what a failure is, one name per concept, from the demo's fault flag
  (``--fault hang``) to the verdict, the words and the cause. ``Kind.words`` is how
  every view says it (``rank 1 hung at step 40``); ``Kind.consequence`` whether it is a
  consequence of another rank's failure (a broken connection, a timed-out receive, a
  stop by the launcher after a peer's death), which is never printed as the cause.
- ``error_kind``: the one rule that reads a consequence out of an error's text: the
  only text read here, because torch and gloo say it in words (``Connection reset by
  peer``, ``Timed out waiting 30000ms``), never in a type.
- ``Evidence``: the typed facts of a failure, as the v4 journal records and the
  failure notice carry them.
- ``VERDICT_PREFIX``: how a notice a liveness monitor published begins its error.

A new kind touches this file only: its member, its words (``WORDS``), whether it is a
consequence (``CONSEQUENCES``), whether its rank raised it and lives to decide
(``RAISED_KINDS``) and, for a kind a liveness monitor names, what showed it
(``DETAILS``, ``LIVENESS_KINDS``); the journal, ``show``'s text, its page and the
exception notes render it from here. An exception class declares its kind
(``failure_kind``: ``NonfiniteLoss``, ``SaveFailed``), and so does a record of a failure
that is no ``failure`` record (``FailedSave``, ``StepSkipped``).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

VERDICT_PREFIX = "LivenessVerdict: "
"""How the error of a failure notice a liveness monitor published begins (``LivenessVerdict: rank 1 hung ...``)."""


class Kind(Enum):
    """What a failure is: one name per concept, the fault flag's, the verdict's, the cause's."""

    RAISED = "raised"
    """The rank raised an exception of its own (its code, an injected fault)."""
    INTERRUPTED = "interrupted"
    """An interrupt (Ctrl-C, an escalated signal) ended the rank."""
    REQUESTED_STOP = "requested_stop"
    """The rank stopped because it was asked to (a SIGTERM with no failure behind it)."""
    STOPPED_BY_LAUNCHER = "stopped_by_launcher"
    """The launcher stopped the rank after a peer's failure: a consequence."""
    DIED = "died"
    """The rank's process ended without a word (SIGKILL, OOM, a segfault)."""
    STOPPED = "stopped"
    """The rank's process was stopped (``T`` in ``/proc``)."""
    SPINNING = "spinning"
    """The rank ran without progress, holding the GIL (``R`` in ``/proc``)."""
    HANG = "hang"
    """The rank slept without progress, behind every peer (``S``/``D`` in ``/proc``)."""
    COLLECTIVE_HANG = "collective_hang"
    """Every rank of a group entered one collective and none left it (a broken link, a partition, a wedged
    transport), every one asleep in it: each rank is released."""
    DESYNC = "desync"
    """The rank waited in a collective its peers never entered, while they waited in one it never entered."""
    STUCK_OUTSIDE = "stuck_outside"
    """The rank slept without progress before a collective its peers in a group entered and waited in."""
    UNRESPONSIVE = "unresponsive"
    """The rank's monitor stopped beating: its host or monitor is gone."""
    STORE_HOST_LOST = "store_host_lost"
    """The rendezvous store's host stopped answering (``StoreHostLost``)."""
    COLLECTIVE_TIMEOUT = "collective_timeout"
    """A collective's receive timed out waiting for a peer: a consequence."""
    CONNECTION_LOST = "connection_lost"
    """A collective's connection to a peer broke (reset, closed): a consequence."""
    MONITOR_LOST = "monitor_lost"
    """The rank's liveness monitor was lost and could not be kept (``MonitorLost``, ``kill`` mode)."""
    NONFINITE_LOSS = "nonfinite_loss"
    """A step's loss was NaN or infinite (``NonfiniteLoss``; a ``step_skipped`` record under ``skip``)."""
    SAVE_FAILED = "save_failed"
    """A checkpoint save was not committed (``SaveFailed``, ``SaveFailures``; a ``save_failed`` record)."""

    @classmethod
    def named(cls, value: str) -> Kind | None:
        """The member whose value is ``value``; None for a name no member has (a later writer's kind)."""
        try:
            return cls(value)
        except ValueError:
            return None

    @property
    def words(self) -> str:
        """How every view says this kind after a rank: ``rank 1 {words} at step 40``."""
        return WORDS[self]

    def detail(self, *, state: str, silent: str, judged: str, collective: str = "") -> str:
        """What showed a liveness monitor this kind, in words (``DETAILS``): its ``/proc`` ``state``, ``silent``
        (seconds without progress, as text), ``judged`` (``killed by its liveness monitor``...), ``collective``
        (``all_reduce #412 of the data-parallel group``; "": not known; for ``DIED``, the one it died inside, which a
        peer called with another op or size); "" for a kind no monitor names."""
        text = DETAILS.get(self, "").format(
            state=state or "T", silent=silent, judged=judged, collective=collective or "a collective"
        )
        if self is Kind.DIED and collective:  # its monitor saw a peer enter it with another op or size
            text += f"; it died inside {collective}, which a peer called with another op or size (a desync)"
        return text

    @property
    def consequence(self) -> bool:
        """Whether a failure of this kind follows another rank's failure, and so is never printed as the cause."""
        return self in CONSEQUENCES


WORDS: dict[Kind, str] = {
    Kind.RAISED: "raised",
    Kind.INTERRUPTED: "was interrupted",
    Kind.REQUESTED_STOP: "stopped on request",
    Kind.STOPPED_BY_LAUNCHER: "was stopped by the launcher",
    Kind.DIED: "died",
    Kind.STOPPED: "stopped",
    Kind.SPINNING: "was spinning",
    Kind.HANG: "hung",
    Kind.STUCK_OUTSIDE: "was stuck before a collective its peers entered",
    Kind.DESYNC: "went past a collective its peers waited in (a desync)",
    Kind.COLLECTIVE_HANG: "hung inside a collective that no rank of its group left",
    Kind.UNRESPONSIVE: "went unresponsive",
    Kind.STORE_HOST_LOST: "lost the store's host",
    Kind.COLLECTIVE_TIMEOUT: "timed out waiting for a peer",
    Kind.CONNECTION_LOST: "lost its connection to a peer",
    Kind.MONITOR_LOST: "lost its liveness monitor",
    Kind.NONFINITE_LOSS: "hit a non-finite loss",
    Kind.SAVE_FAILED: "failed to save a checkpoint",
}
"""Each kind's words, after ``rank R``; a test checks every member has them."""

DETAILS: dict[Kind, str] = {
    Kind.DIED: "killed: no end record, its process gone, its heartbeat stopped",
    Kind.STOPPED: "its process stopped in state {state}, no progress for {silent} s; {judged}",
    Kind.SPINNING: "running, no progress for {silent} s; {judged}",
    Kind.HANG: "alive, no progress for {silent} s while its peers went on; {judged}",
    Kind.DESYNC: "alive, in {collective}, which its peers never entered, for {silent} s (a desync); {judged}",
    Kind.COLLECTIVE_HANG: "alive, in {collective}, which every rank entered and none left, for {silent} s; {judged}",
    Kind.STUCK_OUTSIDE: (
        "alive, no progress for {silent} s, outside {collective}, which its peers entered and waited in; {judged}"
    ),
    Kind.UNRESPONSIVE: "its monitor stopped beating for {silent} s: its host or monitor is gone",
}
"""The evidence a liveness verdict of each kind rests on, in words (``Kind.detail`` fills them in)."""

CONSEQUENCES = frozenset({Kind.STOPPED_BY_LAUNCHER, Kind.COLLECTIVE_TIMEOUT, Kind.CONNECTION_LOST})
"""The kinds that follow another rank's failure: never the cause."""

LIVENESS_KINDS = frozenset(
    {
        Kind.DIED,
        Kind.STOPPED,
        Kind.SPINNING,
        Kind.HANG,
        Kind.STUCK_OUTSIDE,
        Kind.DESYNC,
        Kind.COLLECTIVE_HANG,
        Kind.UNRESPONSIVE,
    }
)
"""The kinds a liveness monitor's verdict names."""

RAISED_KINDS = frozenset({Kind.RAISED, Kind.INTERRUPTED, Kind.NONFINITE_LOSS, Kind.SAVE_FAILED})
"""The kinds of a failure its rank raised and lives through: it knows its exception and its frame, and records the
job's decision itself (``lifecycle._training.retry``); the others' peers decide without waiting for it."""

_CONNECTION = re.compile(
    r"connection (?:reset|closed|refused|lost)|closed by peer|broken pipe|read error|write error|ECONNRESET|EPIPE"
    r"|socket closed|the store is gone|is unreachable",
    re.IGNORECASE,
)
_TIMEOUT = re.compile(r"timed out waiting|socket timeout|wait timeout after", re.IGNORECASE)
_LAUNCHER = "StoppedByLauncher:"


def error_kind(error: str) -> Kind | None:
    """The consequence ``error`` (``Type: message``) shows, if any: the one rule for every process and view.

    ``StoppedByLauncher: ...`` is ``STOPPED_BY_LAUNCHER``; a receive that timed out
    (gloo's ``Timed out waiting 30000ms``, a socket timeout, a store's ``wait timeout
    after 30000ms`` for a key a peer never set) ``COLLECTIVE_TIMEOUT``; a
    connection that broke (reset, closed by peer, broken pipe, an unreachable store)
    ``CONNECTION_LOST``; anything else None (not known to be a consequence). A liveness
    monitor's notice (``VERDICT_PREFIX``) is never a consequence: it names the culprit.
    """
    if error.startswith(VERDICT_PREFIX):
        return None
    if error.startswith(_LAUNCHER):
        return Kind.STOPPED_BY_LAUNCHER
    if _TIMEOUT.search(error) is not None:
        return Kind.COLLECTIVE_TIMEOUT
    if _CONNECTION.search(error) is not None:
        return Kind.CONNECTION_LOST
    return None


def kind_of(error: BaseException) -> Kind:
    """What a failure raising ``error`` is: its class's ``failure_kind`` (``StoppedByLauncher``, ``StoreHostLost``
    declare one), ``INTERRUPTED`` for a ``KeyboardInterrupt``, a consequence its text shows (``error_kind``), else
    ``RAISED``."""
    declared = getattr(type(error), "failure_kind", None)
    if isinstance(declared, Kind):
        return declared
    if isinstance(error, KeyboardInterrupt):
        return Kind.INTERRUPTED
    try:
        text = f"{type(error).__name__}: {error}"
    except Exception:  # noqa: BLE001 - a broken __str__: no text to read
        text = type(error).__name__
    return error_kind(text) or Kind.RAISED


def consequence(error: str, kind: str = "") -> bool:
    """Whether a failure is a consequence of another rank's (never the cause): its ``kind`` (a ``Kind`` value, ""
    if unknown) says so, or its ``error`` text shows one (``error_kind``)."""
    named = Kind.named(kind)
    found = named if named is not None and named is not Kind.RAISED else error_kind(error)
    return found is not None and found.consequence


_COMMUNICATION = re.compile(r"\bDist[A-Za-z]*Error\b|gloo|nccl|ProcessGroup|c10d|collective|\bstore\b", re.IGNORECASE)

OWN_KINDS = frozenset({Kind.RAISED, Kind.INTERRUPTED, Kind.NONFINITE_LOSS})
"""The kinds of a failure that no other rank's can have caused, unless its error came from communication."""


def own_failure(error: str, kind: str = "") -> bool:
    """Whether a failure is its rank's own beyond doubt, so no peer's death can be behind it.

    Its ``kind`` (a ``Kind`` value; "" reads as ``raised``) is one of ``OWN_KINDS``, and
    its ``error`` text (``Type: message``) shows no communication: no torch.distributed
    error type, no gloo, NCCL, process group, collective or store. A failed save is never
    one: its agreement is a collective. A rank whose own failure this is, and a peer that
    reads it as the first notice, need not wait for a liveness verdict naming someone else.
    """
    named = Kind.named(kind or Kind.RAISED.value)
    return named in OWN_KINDS and error_kind(error) is None and _COMMUNICATION.search(error) is None


OMIT_EMPTY = "omit_empty"
"""A dataclass field's metadata key: the field is left out of the JSON while empty (its default); the journal's
schema (``lifecycle.journal._schema.to_json``) honours it for every record."""


@dataclass(frozen=True, slots=True)
class Evidence:
    """The typed facts of a failure: what it is, whose, where, and what showed it.

    ``kind``: a ``Kind`` value; ``rank``: the rank it is about (the culprit, for a
    verdict on a peer); ``step`` (None: none) and ``phase`` (``Session.progress``'s
    names, "" if unknown): where it was last seen making progress; ``process_state``:
    its ``/proc`` state letter when judged ("" if not read); ``silent_s``: seconds
    without progress (None: not measured); ``deadline_s``: the deadline it passed (None:
    none); ``decided_by``: who decided (``rank``: the rank itself, ``monitor``: its
    liveness monitor, ``neighbour``: a peer's monitor, ``store``: a store's error).
    For a verdict inside the step (``STUCK_OUTSIDE``): ``group``, the process group in
    words; ``collective``, the one the rank did not enter (``all_reduce #412``);
    ``peers``, the ranks of the group waiting in it; ``sites``, where the collectives
    named were called, in words. Empty when not about a collective (and then left out
    of the JSON).
    """

    kind: str
    rank: int
    step: int | None = None
    phase: str = ""
    process_state: str = ""
    silent_s: float | None = None
    deadline_s: float | None = None
    decided_by: str = "rank"
    group: str = field(default="", metadata={OMIT_EMPTY: True})
    collective: str = field(default="", metadata={OMIT_EMPTY: True})
    peers: tuple[int, ...] = field(default=(), metadata={OMIT_EMPTY: True})
    sites: str = field(default="", metadata={OMIT_EMPTY: True})

    @property
    def what(self) -> Kind:
        """The ``Kind`` (``ValueError`` for a value no member has)."""
        return Kind(self.kind)

    def to_json(self) -> dict[str, Any]:
        """The evidence as a JSON object: every field, but the collective ones only when set."""
        data = asdict(self)
        for name, value in list(data.items()):
            if not value and Evidence.__dataclass_fields__[name].metadata.get(OMIT_EMPTY):
                del data[name]
        if "peers" in data:
            data["peers"] = list(data["peers"])
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Evidence:
        """The evidence ``to_json`` wrote (fields it does not know are ignored; missing ones take defaults)."""
        fields = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        if "peers" in fields:
            fields["peers"] = tuple(fields["peers"] or ())
        return cls(**fields)

    def words(self) -> str:
        """``rank 1 hung at step 40, phase batch``: the kind's words and where."""
        where = f"phase {self.phase}" if self.step is None else f"step {self.step}, phase {self.phase}"
        return f"rank {self.rank} {self.what.words}" + (f" at {where}" if self.phase else "")
