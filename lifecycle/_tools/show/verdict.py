"""The verdict on one attempt: its cause (the rank whose failure came first), and how every other rank ended.

``analyse`` reads one attempt's records, rank by rank, and finds each rank's end:
closed, failed (when, where, with what), or cut short (no end record). The cause is
found by one rule (``find_cause``), which every view uses (the text, the charts, the
HTML page, the demo's summary, the world tests' report): the earliest failure in the
store's order of failure notices and liveness verdicts. A rank killed without a word
is named by its liveness monitor's verdict (the ``verdict`` record in its journal, which
places it at the verdict's time, or the verdict its peers' notices carry), or, without
one, placed before the connection errors its death caused; a consequence (a broken connection, a timed-out
receive, a launcher's stop: ``lifecycle.journal.evidence``) is said to be one and is never the cause: when
every failure is one, the cause is unknown, said so. The first line names the cause in plain
words (``rank 1 died in the training step at step 80 (killed: no end record, ...)``,
``rank 2 hung in the batch provider at step 41 (alive, no progress for 4.1 s ...)``). Ranks that ended alike
are grouped (``ranks 0, 2-1023: failed 60-80 ms after rank 1 ...``), ranks of the world with no journal are
named, and ``Verdict.lines`` keeps the whole at most 24 lines however many ranks and errors.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum

from lifecycle import journal as _journal
from lifecycle._core.plans import Outcome as PlanOutcome
from lifecycle._core.states import State
from lifecycle._tools.show.cause import (
    FAILED,
    Cause,
    Decided,
    compact,
    from_evidence,
    kind_of,
    quoted_error,
    ranks_text,
    unknown,
)
from lifecycle._tools.show.older import FIRST_NOTE, liveness_cause
from lifecycle.journal import Failure, Record, RunEnd, RunStart, TeardownStep, TrainStep, Transition
from lifecycle.journal.evidence import VERDICT_PREFIX, Evidence, Kind, consequence, error_kind

MAX_LINES = 24
"""The most lines a verdict takes, whatever the number of ranks."""


INDEPENDENT_S = 0.005
"""Two failures at most this far apart by wall time are taken as independent: neither can have caused the other."""

_INDEPENDENT_SHOWN = 3
"""How many independent failures the verdict spells out; the rest are counted."""


class Outcome(Enum):
    """How one rank's part in an attempt ended, as the verdict groups ranks (failed ranks first)."""

    FAILED = "failed"
    """It failed: a failure record, a move into ``failed``, a failure teardown or an end with an error."""
    CUT = "cut"
    """Its journal stops without an end record (killed?)."""
    ENDED = "ended"
    """It ended without failing (its end record's state, ``closed`` usually)."""
    MISSING = "missing"
    """A rank of the world with no journal."""


@dataclass(frozen=True, slots=True)
class RankEnd:
    """How one rank's part in an attempt ended, from its journal.

    ``state``: the state of its ``RunEnd`` (``closed``, ``failed``), or None when its
    journal stops without one (killed?) or it has none (``journaled`` False).
    ``failed_at``: the wall time of its first failure evidence, None if it did not
    fail. ``seq``, ``first_rank``, ``published``: from its ``Failure`` record (None,
    None, False without one). ``phase`` is ``phase <the Failure record's phase>``, else
    ``state <the state it failed from>``; ``step`` the failing step where journaled, ``last_step``
    the last training step it recorded; ``last_state`` the state it last reached;
    ``last_time`` the wall time of its last timed record; ``note`` its ``Failure``
    record's note (which names the first rank, or says why that is unknown).
    Version 4 adds typed facts: ``kind`` (a ``Kind`` value; "" if none), ``facts`` (its
    failure's ``Evidence``, or its verdict's), ``first`` (the first failure's, as its
    notice learned them), ``killed`` (its liveness monitor killed it).
    """

    rank: int
    journaled: bool
    state: str | None
    failed_at: float | None
    seq: int | None
    first_rank: int | None
    published: bool
    phase: str
    step: int | None
    last_step: int | None
    last_state: str
    last_time: float | None
    error: str
    note: str = ""
    kind: str = ""
    facts: Evidence | None = None
    first: Evidence | None = None
    killed: bool = False

    @property
    def consequence(self) -> bool:
        """Whether its failure is a consequence of another rank's (never the cause): its kind says so (version 4),
        or, in an older journal, its error does (``lifecycle.journal.evidence.consequence``)."""
        known = Kind.named(self.kind) if self.kind else None
        return self.failed and (known.consequence if known is not None else not self.kind and consequence(self.error))

    @property
    def judged(self) -> bool:
        """Whether a liveness monitor's verdict is its failure (its typed facts, or an older journal's words)."""
        if self.facts is not None:
            return self.facts.decided_by in ("monitor", "neighbour")
        return self.error.startswith(VERDICT_PREFIX)

    @property
    def failed(self) -> bool:
        """Whether this rank failed (any failure evidence, with or without an end record)."""
        return self.failed_at is not None

    @property
    def outcome(self) -> Outcome:
        """How it ended: failed, cut short, ended, or no journal."""
        if not self.journaled:
            return Outcome.MISSING
        if self.failed:
            return Outcome.FAILED
        return Outcome.CUT if self.state is None else Outcome.ENDED

    def where(self) -> str:
        """``at step 30 (phase step)`` (journaled), or ``in state training, after step 29`` (inferred)."""
        if self.step is not None:
            return f"at step {self.step} ({self.phase})"
        after = f", after step {self.last_step}" if self.last_step is not None else ""
        return f"in {self.phase}{after}"


@dataclass(frozen=True, slots=True)
class Group:
    """Ranks that ended alike (``outcome``); ``rank``: the one drawn for them (the first to fail, else the lowest)."""

    ranks: tuple[int, ...]
    text: str
    rank: int
    outcome: Outcome

    @property
    def failed(self) -> bool:
        """Whether these ranks failed."""
        return self.outcome is Outcome.FAILED


@dataclass(frozen=True, slots=True)
class Verdict:
    """The verdict on one attempt.

    ``first``: the rank whose failure is the cause (None: none failed, or the cause is unknown), placed where
    the cause rule (``find_cause``) puts it; ``cause``: its words; ``decided``: how it
    was found (the store's order, a notice, by wall time; ``NO_FAILURE``: none failed; ``UNKNOWN``: no rank named);
    ``independent``: other ranks that failed on their own, not because of ``first``;
    ``groups``: every other rank, grouped by how it ended; ``ends``: each rank's end,
    by rank (ranks with no journal included); ``notes``: what else to say.
    """

    first: RankEnd | None
    decided: Decided
    independent: tuple[RankEnd, ...]
    groups: tuple[Group, ...]
    ends: Mapping[int, RankEnd]
    notes: tuple[str, ...]
    cause: Cause | None = None

    def headline(self) -> str:
        """The first line: the cause in plain words (``Cause.line``), or how the attempt ended without one."""
        return self.lines(limit=1)[0]

    def lines(self, limit: int = MAX_LINES) -> list[str]:
        """The verdict as at most ``limit`` lines (groups past that are counted in a last ``… and N more`` line)."""
        head: list[str] = []
        world = len(self.ends)
        if self.first is None and self.cause is not None:  # failures, every one a consequence: the cause is unknown
            head.append(self.cause.line())
        elif self.first is None:
            cut = any(g.outcome is Outcome.CUT for g in self.groups)
            # Ranks cut short without a failure (a Ctrl-C, a SIGKILL): none reported one, which is not "none failed".
            said = "no rank reported a failure" if cut else "no rank failed"
            if len(self.groups) == 1:
                return [f"{said}{', and none closed' if cut else ''}: {_all(self.groups[0], world)}"]
            head.append(said)
        elif self.cause is not None:
            head.append(self.cause.line())
            for other in self.independent[:_INDEPENDENT_SHOWN]:
                apart = _ms(abs(_time(other) - _time(self.first)))
                head.append(
                    f"rank {other.rank} failed independently, {apart} ms apart (neither caused the other),"
                    f" {other.where()}: {other.error}"
                )
            if len(self.independent) > _INDEPENDENT_SHOWN:
                rest = compact(e.rank for e in self.independent[_INDEPENDENT_SHOWN:])
                head.append(
                    f"… and {len(self.independent) - _INDEPENDENT_SHOWN} more failed independently: {_short(rest, 100)}"
                )
        head += self.notes
        room = max(limit - len(head), 1)
        kept, more = list(self.groups), ""
        if len(kept) > room:  # the failed ranks' groups give way, the smallest first: the others are few and rarer
            others = [g for g in kept if not g.failed][: room - 1]
            kept = [g for g in kept if g.failed][: room - 1 - len(others)] + others
            dropped = [g for g in self.groups if g not in kept]
            more = f"… and {len(dropped)} more groups ({sum(len(g.ranks) for g in dropped)} ranks)"
        groups = [f"{ranks_text(g.ranks)}: {g.text}" for g in kept]
        if len(kept) < len(self.groups):
            groups.append(more)
        return (head + groups)[:limit]


def _all(group: Group, world: int) -> str:
    """``all 4 ranks closed`` for the one group of a world where no rank failed."""
    if len(group.ranks) == 1:
        return f"rank {group.ranks[0]}: {group.text}"
    return (
        f"all {world} ranks {group.text}" if len(group.ranks) == world else f"{ranks_text(group.ranks)}: {group.text}"
    )


def _time(end: RankEnd) -> float:
    return end.failed_at if end.failed_at is not None else 0.0


def _ms(seconds: float) -> str:
    """Milliseconds, one decimal under 10 ms."""
    ms = seconds * 1000
    return f"{ms:.1f}" if abs(ms) < 10 else f"{ms:.0f}"


def _span(deltas: Sequence[float], who: str) -> str:
    """``60-80 ms after rank 1``, ``3.0 ms before rank 1``, ``2.0 ms before to 80 ms after rank 1``."""
    lo, hi = min(deltas), max(deltas)
    if lo >= 0:
        amount = _ms(lo) if _ms(lo) == _ms(hi) else f"{_ms(lo)}-{_ms(hi)}"
        return f"{amount} ms after {who}"
    if hi <= 0:
        amount = _ms(-hi) if _ms(-hi) == _ms(-lo) else f"{_ms(-hi)}-{_ms(-lo)}"
        return f"{amount} ms before {who}"
    return f"{_ms(-lo)} ms before to {_ms(hi)} ms after {who}"


def _short(text: str, limit: int = 120) -> str:
    """The first line of ``text``, cut to ``limit`` characters."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def rank_end(rank: int, records: Sequence[Record]) -> RankEnd:
    """How ``rank`` ended, from its records of one attempt (in file order; several calls: the last decides)."""
    failure: Failure | None = None
    end: RunEnd | None = None
    into_failed: Transition | None = None
    last_move: Transition | None = None
    last_step: int | None = None
    teardown_error = ""
    judged: _journal.Verdict | None = None
    evidence: list[float] = []
    times: list[float] = []
    for r in records:  # one pass: show reads thousands of ranks
        if isinstance(r, _journal.Verdict):
            judged = judged or (r if r.culprit == rank else None)
        elif isinstance(r, Transition):
            last_move = r
            times.append(r.end)
            if r.dest == State.FAILED:
                evidence.append(r.start)
                into_failed = into_failed or r
        elif isinstance(r, TrainStep):
            last_step = r.step
            if r.end is not None:
                times.append(r.end)
        elif isinstance(r, TeardownStep):
            times.append(r.end)
            if r.outcome == PlanOutcome.FAILURE:
                evidence.append(r.start)
            teardown_error = teardown_error or (r.error or "")
        elif isinstance(r, RunStart):
            times.append(r.start)
        elif isinstance(r, RunEnd):
            end = r
            if r.end is not None:
                times.append(r.end)
        elif isinstance(r, Failure):
            failure = failure or r
            times.append(r.time)
            evidence.append(r.time)
    if end is not None and end.error and end.end is not None:
        evidence.append(end.end)
    last_time = max(times) if times else None
    failed = bool(evidence) or (end is not None and end.state == State.FAILED)
    failed_at = min(evidence) if evidence else (last_time if failed else None)
    if failure is not None:
        phase, step, error = sys.intern(f"phase {failure.phase}"), failure.step, failure.error
    else:
        source = into_failed.source if into_failed is not None else last_move.dest if last_move is not None else "?"
        phase, step = sys.intern(f"state {source}"), None
        error = (end.error if end is not None else None) or (into_failed.detail if into_failed else "") or ""
        error = error or teardown_error
    if failure is None and judged is not None:
        # Its own liveness monitor judged it (and killed it, or reported it): the verdict is its failure notice.
        return _judged(rank, judged, end, last_step, last_move, last_time)
    return RankEnd(
        rank=rank,
        journaled=True,
        state=end.state if end is not None else None,
        failed_at=failed_at,
        seq=failure.seq if failure is not None else None,
        first_rank=failure.first_rank if failure is not None else None,
        published=failure is not None and failure.seq is not None and not failure.unpublished,
        phase=phase,
        step=step,
        last_step=last_step,
        last_state=last_move.dest if last_move is not None else State.UNINITIALIZED.value,
        last_time=last_time,
        error=_short(error) or "(no error recorded)",
        note=sys.intern(failure.note) if failure is not None else "",  # the same few words on thousands of ranks
        kind=failure.evidence.kind if failure is not None and failure.evidence is not None else "",
        facts=failure.evidence if failure is not None else None,
        first=failure.first if failure is not None else None,
    )


def _judged(
    rank: int,
    verdict: _journal.Verdict,
    end: RunEnd | None,
    last_step: int | None,
    last_move: Transition | None,
    last_time: float | None,
) -> RankEnd:
    """A rank a liveness monitor's ``verdict`` names (``Verdict`` record), placed at the verdict's time: its failure
    is the verdict, numbered as the failure notice the monitor published (``seq``)."""
    return RankEnd(
        rank=rank,
        journaled=True,
        state=end.state if end is not None else None,
        failed_at=verdict.time,
        seq=verdict.seq,
        first_rank=None,
        published=verdict.seq is not None,
        phase=f"phase {verdict.phase}",
        step=verdict.step,
        last_step=last_step,
        last_state=last_move.dest if last_move is not None else State.UNINITIALIZED.value,
        last_time=last_time,
        error=_short(f"{VERDICT_PREFIX}{verdict.note}"),
        note=verdict.note,
        kind=verdict.verdict if verdict.evidence is not None else "",
        facts=verdict.evidence,
        killed=verdict.killed,
    )


def _missing(rank: int) -> RankEnd:
    """A rank of the world with no journal."""
    return RankEnd(
        rank=rank,
        journaled=False,
        state=None,
        failed_at=None,
        seq=None,
        first_rank=None,
        published=False,
        phase="",
        step=None,
        last_step=None,
        last_state="",
        last_time=None,
        error="",
    )


def _cause_of(end: RankEnd, decided: Decided, named_by: RankEnd | None = None) -> Cause:
    """``end``'s failure as the cause: from its own record, or (``named_by``) from the peer's note that names it.

    A version 4 journal's typed facts are rendered as they are; only older journals' words are read
    (``lifecycle._tools.show.older``)."""
    if named_by is not None and (facts := named_by.first) is not None and facts.rank == end.rank:
        return from_evidence(facts, end.last_step, decided, killed=end.killed, error=quoted_error(named_by.note))
    if end.facts is not None and end.failed:
        return from_evidence(end.facts, end.last_step, decided, killed=end.killed, error=end.error)
    if named_by is not None and named_by.facts is None:
        for text in (named_by.note, named_by.error):
            cause = liveness_cause(end.rank, end.last_step, text, decided)
            if cause is not None:
                return cause
        said = FIRST_NOTE.match(named_by.note)
        if said is not None and not end.failed:
            error = said["error"]
            return Cause(end.rank, FAILED, "", None, end.last_step, error, decided)
    if end.error.startswith(VERDICT_PREFIX) and end.facts is None:
        cause = liveness_cause(end.rank, end.last_step, end.note or end.error, decided)
        if cause is not None:
            return cause
    if not end.failed:  # killed without a word: no failure record, no end record
        state = f"state {end.last_state}"
        detail = "killed: no end record, no failure notice; its peers' connections to it broke or timed out"
        return Cause(end.rank, Kind.DIED.value, state, None, end.last_step, detail, decided)
    phase = end.phase.removeprefix("phase ")
    kind = Kind.RAISED.value if end.phase.startswith("phase ") and end.step is not None else FAILED
    return Cause(end.rank, kind, phase, end.step, end.last_step, end.error, decided)


def _naming(ends: Iterable[RankEnd]) -> list[RankEnd]:
    """The failed ranks whose notice names another rank as first, in the store's order (their sequence numbers)."""
    named = [e for e in ends if e.failed and e.first_rank is not None and e.first_rank != e.rank]
    return sorted(named, key=lambda e: (e.seq if e.seq is not None else 1 << 62, _time(e), e.rank))


def find_cause(ends: Mapping[int, RankEnd]) -> tuple[RankEnd | None, Cause | None]:
    """The rank whose failure caused the attempt's end, by one rule; (None, None) when no rank failed.

    The store's order decides: the failure notices (each rank's ``Failure`` record and its
    sequence number) and the liveness verdicts (which a survivor's notice names as
    first, for a rank that could not say it itself: killed, stopped, hung, spinning).
    A notice that names another rank as first defers to it. A connection error (reset,
    closed by peer) is a consequence of a peer's failure and never the cause while a
    rank failed otherwise or was killed without a word (no failure, no end record: it is
    placed before the connection errors it caused). Only when no rank journaled a notice
    does wall time decide, labelled as a fallback (hosts' clocks differ).
    """
    failed = [e for e in ends.values() if e.failed]
    if not failed:
        return None, None
    naming = _naming(failed)
    numbered = sorted((e for e in failed if e.seq is not None), key=lambda e: (e.seq, _time(e), e.rank))
    if numbered and numbered[0].first_rank is None and not numbered[0].consequence:
        return numbered[0], _cause_of(numbered[0], Decided.BY_SEQUENCE)
    for by in naming:  # a notice that names a rank whose own failure is a consequence names a victim
        named = ends.get(by.first_rank) if by.first_rank is not None else None
        if named is not None and named.rank != by.rank and not named.consequence and not _stale(by, named):
            decided = Decided.BY_SEQUENCE if named.seq is not None else Decided.BY_NOTICE
            return _placed(named, by), _cause_of(named, decided, by)
    own = [e for e in numbered if not e.consequence]
    if own:
        return own[0], _cause_of(own[0], Decided.BY_SEQUENCE)
    killed = sorted((e for e in ends.values() if e.outcome is Outcome.CUT), key=lambda e: (e.last_time or 0.0, e.rank))
    if killed and all(e.consequence for e in failed):
        first = killed[0]
        placed = replace(first, failed_at=min(_time(e) for e in failed))
        return placed, _cause_of(first, Decided.BY_CONSEQUENCE)
    judged = sorted((e for e in failed if e.judged), key=lambda e: (_time(e), e.rank))
    if judged:  # a liveness verdict whose notice the store did not number (it was gone): still before consequences
        return judged[0], _cause_of(judged[0], Decided.BY_VERDICT)
    mine = [e for e in failed if not e.consequence]
    if not mine:  # every failure is a consequence and nobody is named: say so, never name a victim
        seen = numbered[0] if numbered else min(failed, key=lambda e: (_time(e), e.rank))
        kind = seen.kind or (error_kind(seen.error) or Kind.CONNECTION_LOST).value
        return None, unknown(seen.rank, kind, seen.phase.removeprefix("phase "), seen.step, seen.last_step, seen.error)
    first = min(mine, key=lambda e: (_time(e), e.rank))
    return first, _cause_of(first, Decided.BY_WALL_TIME)


def _stale(by: RankEnd, named: RankEnd) -> bool:
    """Whether the notice ``by`` learned names ``named`` stale: a monitor named it unresponsive, and its own
    journal shows it trained on past the step named (its silence was its monitor's, not its own)."""
    said = by.first
    unresponsive = said is not None and said.kind == Kind.UNRESPONSIVE.value and said.step is not None
    return unresponsive and said is not None and (named.last_step or 0) > (said.step or 0)


def _placed(named: RankEnd, by: RankEnd) -> RankEnd:
    """The named rank, placed where the notice that names it puts it: no later than that notice's own failure."""
    if named.failed:
        return named
    return replace(named, failed_at=_time(by), error=_short(quoted_error(by.note)))


def order(ends: Mapping[int, RankEnd]) -> list[RankEnd]:
    """The failed ranks in the order they failed, by ``find_cause``'s rule: the cause first, then by the store's
    sequence number, then by wall time (a rank killed without a word and not the cause comes last)."""
    first, _ = find_cause(ends)
    rest = [e for e in ends.values() if e.failed and (first is None or e.rank != first.rank)]
    rest.sort(key=lambda e: (e.seq is None, e.seq or 0, _time(e), e.rank))
    return ([first] if first is not None else []) + rest


def _independent(first: RankEnd, other: RankEnd) -> bool:
    """Whether ``other`` failed on its own: not a consequence (a connection error, or its notice names ``first``),
    and within ``INDEPENDENT_S`` of ``first``, or, having published its own notice, it names no peer as first and
    has no note (a note without a first rank says why the first was unknown, as when notice 1 could not be read:
    that is no evidence of independence)."""
    if other.consequence:
        return False
    if abs(_time(other) - _time(first)) <= INDEPENDENT_S:
        return True
    return other.published and other.first_rank is None and not other.note and first.first_rank != other.rank


_Alike = tuple[Outcome, tuple[str, ...]]
"""What ranks that ended alike share: their outcome and what else tells them apart (phase, error kind, state)."""


def _describe(end: RankEnd, first: RankEnd | None) -> tuple[_Alike, str]:
    """A rank's end as (what ranks that ended alike share, the text without times); times are added per group."""
    outcome = end.outcome
    if outcome is Outcome.MISSING:
        return (outcome, ()), "no journal"
    if outcome is Outcome.FAILED:
        cut = "" if end.state is not None else ", then no end record (ended from outside)"
        named = ""
        if end.first_rank is not None and (first is None or end.first_rank != first.rank):
            named = f" (its note names rank {end.first_rank} as first)"
        consequence = "a consequence, " if end.consequence else ""
        alike = (end.phase, kind_of(end.error), named, cut, consequence)
        return (outcome, alike), f"{consequence}{end.where()}: {end.error}{named}{cut}"
    if outcome is Outcome.CUT:
        after = f", last step {end.last_step}" if end.last_step is not None else ""
        how = "ended from outside (killed or signalled)"
        return (outcome, (end.last_state,)), f"no end record — {how} (in state {end.last_state}{after}"
    state = end.state or ""
    return (outcome, (state,)), state


def analyse(ranks: Mapping[int, Sequence[Record]]) -> Verdict:
    """The verdict on one attempt, from each rank's records of it (``ranks``: rank → its records in file order).

    The cause is ``find_cause``'s. Ranks below the largest ``RunStart.world_size`` that
    have no records are reported as having no journal.
    """
    world = max((r.world_size for rs in ranks.values() for r in rs if isinstance(r, RunStart)), default=0)
    return judge({rank: rank_end(rank, records) for rank, records in ranks.items()}, world)


def judge(known: Mapping[int, RankEnd], world: int) -> Verdict:
    """``analyse``'s verdict from each journaled rank's end (``known``: rank → its ``rank_end``) and the world size
    (the largest ``RunStart.world_size``): what a reader that keeps one ``RankEnd`` per rank, not its records,
    decides on."""
    ends = dict(known)
    for rank in range(world):
        ends.setdefault(rank, _missing(rank))
    ends = dict(sorted(ends.items()))
    failed = [e for e in ends.values() if e.failed]
    first, cause = find_cause(ends)
    decided = cause.decided if cause is not None else Decided.NO_FAILURE
    independent = tuple(
        sorted((e for e in failed if first is not None and e.rank != first.rank and _independent(first, e)), key=_time)
    )
    notes: list[str] = []
    if first is not None and decided is Decided.BY_SEQUENCE:
        earlier = [e for e in failed if e.seq is None and _time(e) < _time(first) - INDEPENDENT_S and not e.consequence]
        if earlier:
            e = min(earlier, key=_time)
            notes.append(
                f"note: rank {e.rank} failed {_ms(_time(first) - _time(e))} ms earlier by wall time but journaled"
                " no published notice"
            )
    shown = {first.rank} if first is not None else set()
    shown |= {e.rank for e in independent}
    buckets: dict[_Alike, list[RankEnd]] = {}
    texts: dict[_Alike, str] = {}
    for end in ends.values():
        if end.rank in shown:
            continue
        key, text = _describe(end, first)
        buckets.setdefault(key, []).append(end)
        texts.setdefault(key, text)
    placed = decided in (Decided.BY_NOTICE, Decided.BY_CONSEQUENCE)
    groups = [_group(outcome, members, texts[(outcome, alike)], first, world, placed)
              for (outcome, alike), members in buckets.items()]  # fmt: skip
    order_ = list(Outcome)  # failed first, then cut short, ended, no journal
    groups.sort(key=lambda g: (order_.index(g.outcome), -len(g.ranks), g.ranks[0]))
    return Verdict(first, decided, independent, tuple(groups), ends, tuple(notes), cause)


def _group(
    outcome: Outcome, members: list[RankEnd], text: str, first: RankEnd | None, world: int, placed: bool = False
) -> Group:
    """A group of ranks that ended alike, its text timed against ``first``'s failure where there is one (``placed``:
    the cause journaled no failure, and is timed by the first notice that names it)."""
    ranks = tuple(e.rank for e in members)
    if outcome is Outcome.FAILED:
        drawn = min(members, key=_time).rank
        if first is not None:
            who = f"the first notice naming rank {first.rank}" if placed else f"rank {first.rank}"
            text = f"failed {_span([_time(e) - _time(first) for e in members], who)}, {text}"
        else:
            text = f"failed, {text}"
        return Group(ranks, text, drawn, outcome)
    if outcome is Outcome.CUT:
        lasts = [e.last_time for e in members if e.last_time is not None]
        if first is not None and lasts:
            who = f"the first notice naming rank {first.rank}" if placed else f"rank {first.rank} failed"
            text += f"; last record {_span([t - _time(first) for t in lasts], who)}"
        return Group(ranks, text + ")", ranks[0], outcome)
    if outcome is Outcome.MISSING:
        return Group(ranks, f"{text} (world size {world})", ranks[0], outcome)
    return Group(ranks, text, ranks[0], outcome)
