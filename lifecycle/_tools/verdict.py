"""The verdict on one attempt: which rank failed first, and how every other rank ended.

``analyse`` reads one attempt's records, rank by rank, and finds each rank's end:
closed, failed (when, where, with what), or cut short (no end record: killed?). The
first failure is ordered by the store's sequence number where the ranks journaled a
``Failure`` record with one (the live failure notice), otherwise by the wall time of
the first failure evidence: the ``Failure`` record's time, the start of the move into
``failed``, the first step of a failure teardown, or a ``RunEnd`` with an error.
Ranks that ended alike are grouped (``ranks 0, 2-1023: failed 60-80 ms after rank
1 ...``), ranks of the world (``RunStart.world_size``) with no journal are named, and
``Verdict.lines`` keeps the whole at most 24 lines however many ranks and errors.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum

from lifecycle._core.plans import Outcome as PlanOutcome
from lifecycle._core.states import State
from lifecycle.journal import Failure, Record, RunEnd, RunStart, TeardownStep, TrainStep, Transition

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


class Decided(Enum):
    """How the verdict found the rank that failed first."""

    NO_FAILURE = "no rank failed"
    BY_SEQUENCE = "by the store's sequence number"
    BY_WALL_TIME = "by wall time: no failure notice was journaled"
    BY_NOTICE = "named by a peer's notice: it journaled no failure, its liveness monitor published it"


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

    ``first``: the rank that failed first (None: no rank failed); ``decided``: how it
    was found (by the store's sequence number, by wall time; ``NO_FAILURE`` when none failed);
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

    def lines(self, limit: int = MAX_LINES) -> list[str]:
        """The verdict as at most ``limit`` lines (groups past that are counted in a last ``… and N more`` line)."""
        head: list[str] = []
        world = len(self.ends)
        if self.first is None:
            if len(self.groups) == 1:
                return [f"no rank failed: {_all(self.groups[0], world)}"]
            head.append("no rank failed")
        else:
            head.append(
                f"rank {self.first.rank} failed first ({self.decided.value}), {self.first.where()}: {self.first.error}"
            )
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
        groups = [f"{_ranks(g.ranks)}: {g.text}" for g in kept]
        if len(kept) < len(self.groups):
            groups.append(more)
        return (head + groups)[:limit]


def _all(group: Group, world: int) -> str:
    """``all 4 ranks closed`` for the one group of a world where no rank failed."""
    if len(group.ranks) == 1:
        return f"rank {group.ranks[0]}: {group.text}"
    return f"all {world} ranks {group.text}" if len(group.ranks) == world else f"{_ranks(group.ranks)}: {group.text}"


def _time(end: RankEnd) -> float:
    return end.failed_at if end.failed_at is not None else 0.0


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


def _ranks(ranks: Sequence[int], limit: int = 80) -> str:
    """``rank 3`` or ``ranks 0, 2-1023``; ranges past ``limit`` characters are cut, the count said."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    ranges = compact(ranks)
    if len(ranges) > limit:
        ranges = ranges[:limit].rsplit(", ", 1)[0] + f", … ({len(ranks)} ranks)"
    return f"ranks {ranges}"


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


_NUMBER = re.compile(r"\d+")


def _kind_of(error: str) -> str:
    """What errors that differ only in their numbers (ports, pids, ranks, addresses) share."""
    return _NUMBER.sub("#", error)


def rank_end(rank: int, records: Sequence[Record]) -> RankEnd:
    """How ``rank`` ended, from its records of one attempt (in file order; several calls: the last decides)."""
    failure: Failure | None = None
    end: RunEnd | None = None
    into_failed: Transition | None = None
    last_move: Transition | None = None
    last_step: int | None = None
    teardown_error = ""
    evidence: list[float] = []
    times: list[float] = []
    for r in records:  # one pass: show reads thousands of ranks
        if isinstance(r, Transition):
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
        phase, step, error = f"phase {failure.phase}", failure.step, failure.error
    else:
        source = into_failed.source if into_failed is not None else last_move.dest if last_move is not None else "?"
        phase, step = f"state {source}", None
        error = (end.error if end is not None else None) or (into_failed.detail if into_failed else "") or ""
        error = error or teardown_error
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
        note=failure.note if failure is not None else "",
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


def _first(failed: Sequence[RankEnd]) -> tuple[RankEnd | None, Decided]:
    """The rank that failed first, and how that was decided."""
    numbered = [e for e in failed if e.seq is not None]
    if numbered:
        return min(numbered, key=lambda e: (e.seq, _time(e), e.rank)), Decided.BY_SEQUENCE
    if failed:
        return min(failed, key=lambda e: (_time(e), e.rank)), Decided.BY_WALL_TIME
    return None, Decided.NO_FAILURE


def _named_by_notice(first: RankEnd, ends: Mapping[int, RankEnd]) -> RankEnd | None:
    """The rank that the first journaled notice names as first when that rank journaled no failure (None otherwise).

    A rank judged and killed by its liveness monitor (stopped, spinning, hung) or dead
    writes no ``Failure`` record; its monitor publishes its notice, which the survivors'
    notes name. It is reported as failed when its journal last says anything, with the
    survivor's note as its error.
    """
    if first.seq == 1 or first.first_rank is None:
        return None
    named = ends.get(first.first_rank)
    if named is None or named.failed or named.state is not None:
        return None
    error = re.sub(r"^lifecycle: (rank \d+ failed first \([^)]*\): )?", "", first.note)
    return replace(named, failed_at=named.last_time if named.last_time is not None else first.failed_at, error=error)


def _independent(first: RankEnd, other: RankEnd) -> bool:
    """Whether ``other`` failed on its own: within ``INDEPENDENT_S`` of ``first``, or, having published its own
    notice, it names no peer as first and has no note (a note without a first rank says why the first was unknown,
    as when notice 1 could not be read: that is no evidence of independence)."""
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
        cut = "" if end.state is not None else ", then no end record — killed?"
        named = ""
        if end.first_rank is not None and (first is None or end.first_rank != first.rank):
            named = f" (its note names rank {end.first_rank} as first)"
        alike = (end.phase, _kind_of(end.error), named, cut)
        return (outcome, alike), f"{end.where()}: {end.error}{named}{cut}"
    if outcome is Outcome.CUT:
        after = f", last step {end.last_step}" if end.last_step is not None else ""
        return (outcome, (end.last_state,)), f"no end record — killed? (in state {end.last_state}{after}"
    state = end.state or ""
    return (outcome, (state,)), state


def analyse(ranks: Mapping[int, Sequence[Record]]) -> Verdict:
    """The verdict on one attempt, from each rank's records of it (``ranks``: rank → its records in file order).

    Ranks below the largest ``RunStart.world_size`` that have no records are reported as
    having no journal.
    """
    world = max((r.world_size for rs in ranks.values() for r in rs if isinstance(r, RunStart)), default=0)
    ends = {rank: rank_end(rank, records) for rank, records in ranks.items()}
    for rank in range(world):
        ends.setdefault(rank, _missing(rank))
    ends = dict(sorted(ends.items()))
    failed = [e for e in ends.values() if e.failed]
    first, decided = _first(failed)
    if first is not None and decided is Decided.BY_SEQUENCE:
        named = _named_by_notice(first, ends)
        if named is not None:
            first, decided = named, Decided.BY_NOTICE
    independent = tuple(
        sorted((e for e in failed if first is not None and e is not first and _independent(first, e)), key=_time)
    )
    notes: list[str] = []
    if first is not None and decided is Decided.BY_SEQUENCE:
        earlier = [e for e in failed if e.seq is None and _time(e) < _time(first) - INDEPENDENT_S]
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
    groups = [_group(outcome, members, texts[(outcome, alike)], first, world)
              for (outcome, alike), members in buckets.items()]  # fmt: skip
    order = list(Outcome)  # failed first, then cut short, ended, no journal
    groups.sort(key=lambda g: (order.index(g.outcome), -len(g.ranks), g.ranks[0]))
    return Verdict(first, decided, independent, tuple(groups), ends, tuple(notes))


def _group(outcome: Outcome, members: list[RankEnd], text: str, first: RankEnd | None, world: int) -> Group:
    """A group of ranks that ended alike, its text timed against ``first``'s failure where there is one."""
    ranks = tuple(e.rank for e in members)
    if outcome is Outcome.FAILED:
        drawn = min(members, key=_time).rank
        if first is not None:
            text = f"failed {_span([_time(e) - _time(first) for e in members], f'rank {first.rank}')}, {text}"
        else:
            text = f"failed, {text}"
        return Group(ranks, text, drawn, outcome)
    if outcome is Outcome.CUT:
        lasts = [e.last_time for e in members if e.last_time is not None]
        if first is not None and lasts:
            text += f"; last record {_span([t - _time(first) for t in lasts], f'rank {first.rank} failed')}"
        return Group(ranks, text + ")", ranks[0], outcome)
    if outcome is Outcome.MISSING:
        return Group(ranks, f"{text} (world size {world})", ranks[0], outcome)
    return Group(ranks, text, ranks[0], outcome)
