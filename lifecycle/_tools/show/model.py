"""What ``show`` shows, apart from how: journal records grouped into runs, jobs and attempts, each with its verdict.

``build(records)`` returns a ``Model``: its ``runs`` in order of first appearance (the
jobs of a shared run id in turn, see ``job_of_each``), each with its ``attempts`` (one
per ``AttemptKey``: torchrun restart count, ``pretrain`` attempt, restart mode and
in-process iteration, ordered by restart count then attempt number) and its ``drawn``
attempts (one per attempt number, in-process iterations merged: what a chart shows).
Attempts are numbered on across torchrun restarts (``number``), since a restarted
worker counts its attempts from 0 again. Every attempt carries its verdict
(``lifecycle._tools.show.verdict``), its ``Overview`` (what the views say of every rank: its
ranks, start times, paths through the states) and the records of its ranks: all of them
from ``build``; from ``scan``, which reads journal files one at a time, only those of the
ranks the views print or draw (``shown``). The views (``show``'s text, the diagrams and
gantt charts, the HTML page) read only this model.
"""

from __future__ import annotations

import math
import os
import pathlib
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from lifecycle import journal as _journal
from lifecycle._tools.show import verdict as _verdict
from lifecycle._tools.show.cause import compact, killed_path
from lifecycle.journal import Eval, Origin, Record, RunStart, TeardownStep, TrainStep, Transition


@dataclass(frozen=True, slots=True, order=True)
class RunKey:
    """A run: its ``run_id``, and which ``job`` of those that shared it (0 unless jobs shared the run id)."""

    run_id: str
    job: int


@dataclass(frozen=True, slots=True)
class AttemptKey:
    """An attempt's identity within its ``run``: torchrun's ``restart_count``, the ``pretrain`` ``attempt`` number,
    the session's ``restart_mode`` and in-process ``iteration``."""

    run: RunKey
    restart_count: int
    attempt: int
    restart_mode: str
    iteration: int


Ranks = dict[int, list[Record]]
"""Each rank's records of one attempt, in file order, by rank."""

Path_ = tuple[tuple[str, str, str], ...]
"""A rank's path through the states: its moves as (source, trigger, dest), in order."""

MAX_ROWS = 16
"""The most rows (ranks, or groups of ranks drawn by one of theirs) a chart of an attempt draws."""

TIMELINE_RANKS = 64
"""Up to this many journaled ranks in an attempt, the text timeline lists every rank; beyond, the ranks its charts
draw (the cause's, the independent failures', one of each group of ranks that ended alike), each under its group."""


@dataclass(frozen=True, slots=True)
class Overview:
    """What the views say of every rank of an attempt, gathered rank by rank (no rank's records are kept for it).

    ``journaled``: the ranks with records, in order. ``t0``: the earliest time the
    timeline lists (``earliest``; None if nothing is timed). ``first_move``: the earliest
    start of a ``RunStart`` or ``Transition`` (the gantt chart's zero); ``first_event``: of a
    ``RunStart``, ``Transition`` or ``TeardownStep`` (the SVG timeline's). ``paths``: each
    path through the states a rank took, with the ranks that took it, by their first rank.
    """

    journaled: tuple[int, ...]
    t0: float | None
    first_move: float | None
    first_event: float | None
    paths: tuple[tuple[Path_, tuple[int, ...]], ...]

    @property
    def moves(self) -> frozenset[tuple[str, str, str]]:
        """Every move any rank made, as (trigger, source, dest)."""
        return frozenset((trigger, source, dest) for path, _ in self.paths for source, trigger, dest in path)


@dataclass(frozen=True, slots=True)
class Row:
    """A row of a chart (or a shown rank of a grouped timeline): its ``name``, the ``rank`` drawn, and the ``group``
    of ranks it stands for (None for the cause's and the independent failures' rows, and below ``MAX_ROWS`` ranks)."""

    name: str
    rank: int
    group: _verdict.Group | None = None


def chart_rows(journaled: Sequence[int], verdict: _verdict.Verdict) -> tuple[list[Row], int]:
    """The rows to draw, and how many groups were left out: a row per rank up to ``MAX_ROWS`` ranks; beyond, the
    cause's rank, the independent failures, then one row per group (``verdict.Group``) whose drawn rank has records."""
    if len(journaled) <= MAX_ROWS:
        return [Row(f"rank {rank}", rank) for rank in journaled], 0
    rows: list[Row] = []
    if verdict.first is not None:
        rows.append(Row(f"rank {verdict.first.rank} (the cause)", verdict.first.rank))
    rows += [Row(f"rank {e.rank} (failed independently)", e.rank) for e in verdict.independent[:3]]
    present = set(journaled)
    drawn = [g for g in verdict.groups if g.rank in present]
    room = MAX_ROWS - len(rows)
    for group in drawn[:room]:
        who = f"rank {group.ranks[0]}" if len(group.ranks) == 1 else f"ranks {compact(group.ranks)}"
        who = who if len(who) <= 40 else who[:39] + "…"
        rows.append(Row(f"{who} (rank {group.rank} drawn)", group.rank, group))
    return rows, max(len(drawn) - room, 0)


def shown(overview: Overview, verdict: _verdict.Verdict) -> list[int]:
    """The ranks whose records the views read (the others' are in the overview and the verdict): every journaled
    rank up to ``TIMELINE_RANKS``; beyond, the rows of ``chart_rows``."""
    if len(overview.journaled) <= TIMELINE_RANKS:
        return list(overview.journaled)
    return sorted({row.rank for row in chart_rows(overview.journaled, verdict)[0]})


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt: its ``key``, the ``number`` show gives it, its ``label``, its verdict and overview, and the
    records of its ranks: every rank's when built from records (``build``), the ``shown`` ranks' when ``scan``ned."""

    key: AttemptKey
    number: int
    label: str
    ranks: Ranks
    verdict: _verdict.Verdict
    overview: Overview


@dataclass(frozen=True, slots=True)
class Drawn:
    """One numbered attempt as a chart draws it, its in-process iterations merged.

    ``stem``: its files' name stem (``attempt2``, ``<run id>-job2-attempt0``); ``label``;
    ``ranks`` (as ``Attempt.ranks``); ``t0``: its first event's time; ``verdict`` and
    ``overview`` on the merged records.
    """

    stem: str
    label: str
    ranks: Ranks
    t0: float
    verdict: _verdict.Verdict
    overview: Overview


@dataclass(frozen=True, slots=True)
class Run:
    """One run (one job of its run id): its attempts, its numbered (drawn) attempts, its first event's time ``t0``.

    ``jobs``: how many jobs shared its run id (1 usually).
    """

    key: RunKey
    jobs: int
    t0: float
    attempts: tuple[Attempt, ...]
    drawn: tuple[Drawn, ...]


@dataclass(frozen=True, slots=True)
class Model:
    """Everything show says about some journals: their ``runs``, and the ``warnings`` to give before them."""

    runs: tuple[Run, ...]
    warnings: tuple[str, ...]

    @property
    def run_ids(self) -> list[str]:
        """The run ids, each once, in order of first appearance."""
        return list(dict.fromkeys(run.key.run_id for run in self.runs))


def earliest(records: Sequence[Record]) -> float | None:
    """The earliest time the timeline lists for ``records`` (start, moves, teardown steps, last step); None if none."""
    times = [r.start for r in records if isinstance(r, RunStart | Transition | TeardownStep)]
    last = next((r for r in reversed(records) if isinstance(r, TrainStep)), None)
    if last is not None and last.end is not None:
        times.append(last.end)
    return min(times, default=None)


def job_of_each(records: Sequence[Record]) -> list[int]:
    """For each record, the job of its run id it belongs to: 0, unless jobs shared the run id.

    Two jobs share a run id when, say, both ran under torchrun at one address without
    an ``--rdzv-id``. A job is told from the next by a rank starting an attempt (the
    same restart count, attempt, restart mode and iteration) that it already started:
    walking a run id's ``RunStart`` records by start time, each such repeat begins the
    next job. A record belongs to the job of its rank's last ``RunStart`` before it.
    """
    job_of_start = _jobs_of_starts((index, r) for index, r in enumerate(records) if isinstance(r, RunStart))
    if not any(job_of_start.values()):  # the usual case, one job per run id: skip the walk (show reads 1,000s of ranks)
        return [0] * len(records)
    jobs: list[int] = []
    current: dict[tuple[str, int], int] = {}  # (run id, rank): the job of the rank's last start
    for index, r in enumerate(records):
        where = (r.origin.run_id, r.origin.rank)
        if index in job_of_start:
            current[where] = job_of_start[index]
        jobs.append(current.get(where, 0))
    return jobs


def _jobs_of_starts(starts: Iterable[tuple[int, RunStart]]) -> dict[int, int]:
    """``job_of_each``'s walk: the job of each ``RunStart``, by its position (its index in the records read)."""
    by_run: dict[str, list[tuple[float, int, RunStart]]] = {}
    for index, r in starts:
        by_run.setdefault(r.origin.run_id, []).append((r.start, index, r))
    job_of_start: dict[int, int] = {}
    for run_starts in by_run.values():
        job, seen = 0, set[tuple[int, int, int, str, int]]()
        for _, index, r in sorted(run_starts, key=lambda s: (s[0], s[1])):
            o = r.origin
            key = (o.rank, o.restart_count, o.attempt, o.restart_mode, o.iteration)
            if key in seen:
                job, seen = job + 1, set()
            seen.add(key)
            job_of_start[index] = job
    return job_of_start


def _grouped(records: Sequence[Record], jobs: Sequence[int]) -> dict[AttemptKey, Ranks]:
    """Records grouped by attempt, then by rank: runs in order of first appearance, each run's attempts by
    (restart count, attempt number), then in order of first appearance (in-process iterations)."""
    grouped: dict[AttemptKey, Ranks] = {}
    for r, job in zip(records, jobs, strict=True):
        o = r.origin
        key = AttemptKey(RunKey(o.run_id, job), o.restart_count, o.attempt, o.restart_mode, o.iteration)
        grouped.setdefault(key, {}).setdefault(o.rank, []).append(r)
    return {key: dict(sorted(grouped[key].items())) for key in _ordered(grouped)}


def _ordered(keys: Iterable[AttemptKey]) -> list[AttemptKey]:
    """Attempt keys in show's order: runs in order of first appearance, each run's attempts by (restart count,
    attempt number), then in order of first appearance (in-process iterations); ``keys`` in order of appearance."""
    keys = list(keys)
    runs = {run_id: i for i, run_id in enumerate(dict.fromkeys(key.run.run_id for key in keys))}
    return sorted(keys, key=lambda k: (runs[k.run.run_id], k.run.job, k.restart_count, k.attempt))  # stable


def _numbers(keys: Sequence[AttemptKey]) -> dict[AttemptKey, int]:
    """The number show gives each attempt: its own until torchrun restarts, then one more than the run's last.

    Within a run, in the order given: ``max(attempt, previous + 1)`` per distinct
    (restart count, attempt), so a run that torchrun never restarted keeps its attempt
    numbers, and a restarted worker's attempt 0 follows the attempts before.
    """
    numbers: dict[AttemptKey, int] = {}
    last: dict[RunKey, tuple[tuple[int, int], int]] = {}  # per run: the last (restarts, attempt) and its number
    for key in keys:
        seen = last.get(key.run)
        here = (key.restart_count, key.attempt)
        if seen is not None and seen[0] == here:
            number = seen[1]
        else:
            number = key.attempt if seen is None else max(key.attempt, seen[1] + 1)
        last[key.run] = (here, number)
        numbers[key] = number
    return numbers


def _label(key: AttemptKey, number: int, restarted: bool) -> str:
    """``attempt N``, noting the torchrun restart (in a ``restarted`` run), the call's own number, the restart mode."""
    notes = []
    if restarted:
        notes.append(f"torchrun restart {key.restart_count}")
    if key.restart_count > 0 and key.attempt > 0:  # a restarted worker's first call is its attempt 0: said otherwise
        notes.append(f"pretrain attempt {key.attempt}")
    if key.restart_mode != "ordinary" or key.iteration != 0:
        notes.append(f"restart mode {key.restart_mode}, iteration {key.iteration}")
    return f"attempt {number}" + (f" ({', '.join(notes)})" if notes else "")


def _warnings(ids: Sequence[str], jobs_of: Mapping[str, int]) -> tuple[str, ...]:
    """Journals of several runs (``ids``, in order of first appearance), or of several jobs that shared a run id
    (``jobs_of``: run id → its number of jobs): each is shown on its own."""
    warnings = []
    if len(ids) > 1:
        warnings.append(
            f"these journals are of {len(ids)} different runs ({', '.join(ids)}): each is shown as a run of its own"
        )
    for run_id, jobs in jobs_of.items():
        if jobs > 1:
            warnings.append(
                f"run id {run_id} was used by {jobs} jobs (a rank started the same attempt again):"
                " each is shown as a run of its own, in order of start time"
            )
    return tuple(warnings)


class _Gather:
    """One attempt's overview and rank ends, gathered rank by rank: what is kept of its ranks once read."""

    __slots__ = ("ends", "files", "first_event", "first_move", "paths", "t0", "world")

    def __init__(self) -> None:
        self.ends: dict[int, _verdict.RankEnd] = {}
        self.files: dict[int, int] = {}  # rank → the index of the file its records were read from
        self.world = 0
        self.t0: float | None = None
        self.first_move: float | None = None
        self.first_event: float | None = None
        self.paths: dict[Path_, list[int]] = {}

    @classmethod
    def of(cls, ranks: Ranks) -> _Gather:
        """The gathering of every rank of ``ranks``."""
        gather = cls()
        for rank, records in ranks.items():
            gather.add(rank, records)
        return gather

    def add(self, rank: int, records: Sequence[Record], file: int = -1) -> bool:
        """Take in ``rank``'s records of this attempt (read from file number ``file``); False (nothing taken) if the
        rank was taken in before: its records are in more than one file."""
        if rank in self.ends:
            return False
        moves: list[tuple[str, str, str]] = []
        first_move = first_event = None
        last_step: TrainStep | None = None
        for r in records:
            if isinstance(r, Transition):
                moves.append((r.source, r.trigger, r.dest))
            elif isinstance(r, RunStart):
                self.world = max(self.world, r.world_size)
            elif isinstance(r, TrainStep):
                last_step = r
                continue
            elif not isinstance(r, TeardownStep):
                continue
            start = r.start
            first_event = start if first_event is None or start < first_event else first_event
            if not isinstance(r, TeardownStep):
                first_move = start if first_move is None or start < first_move else first_move
        self.ends[rank] = _verdict.rank_end(rank, records)
        self.files[rank] = file
        self.paths.setdefault(killed_path(moves, records, rank), []).append(rank)
        self.first_move = _least(self.first_move, first_move)
        self.first_event = _least(self.first_event, first_event)
        self.t0 = _least(self.t0, _least(first_event, last_step.end if last_step is not None else None))
        return True

    def verdict(self) -> _verdict.Verdict:
        """The attempt's verdict (``verdict.judge``)."""
        return _verdict.judge(self.ends, self.world)

    def overview(self) -> Overview:
        """The attempt's overview."""
        paths = sorted((path, tuple(sorted(ranks))) for path, ranks in self.paths.items())
        return Overview(
            journaled=tuple(sorted(self.ends)),
            t0=self.t0,
            first_move=self.first_move,
            first_event=self.first_event,
            paths=tuple(sorted(paths, key=lambda item: item[1][0])),
        )


def _least(a: float | None, b: float | None) -> float | None:
    """The smaller of two times, either of which may be None (unknown)."""
    if a is None:
        return b
    return a if b is None or a <= b else b


def build(records: Sequence[Record]) -> Model:
    """The model of ``records`` (any journals' records, in file order): runs, jobs, attempts, verdicts, warnings.

    Every rank's records are kept in its attempts (``Attempt.ranks``); ``scan`` builds the
    same model from journal files, keeping only the ranks the views read.
    """
    jobs = job_of_each(records)
    grouped = _grouped(records, jobs)
    ids = list(dict.fromkeys(r.origin.run_id for r in records))
    jobs_of: dict[str, int] = {}
    for key in grouped:
        jobs_of[key.run.run_id] = max(jobs_of.get(key.run.run_id, 0), key.run.job + 1)
    gathers = {key: _Gather.of(ranks) for key, ranks in grouped.items()}
    return _assemble(gathers, grouped, _warnings(ids, jobs_of))


def _assemble(
    gathers: Mapping[AttemptKey, _Gather], kept: Mapping[AttemptKey, Ranks], warnings: tuple[str, ...]
) -> Model:
    """The model of the attempts gathered (in order: see ``_grouped``), with the records ``kept`` of their ranks."""
    keys = list(gathers)
    numbers = _numbers(keys)
    restarted = {key.run for key in keys if key.restart_count > 0}
    several = len({key.run.run_id for key in keys}) > 1
    shared = {key.run.run_id for key in keys if key.run.job > 0}
    jobs_of = {key.run.run_id: 1 + max(k.run.job for k in keys if k.run.run_id == key.run.run_id) for key in keys}
    by_run: dict[RunKey, list[AttemptKey]] = {}
    for key in keys:
        by_run.setdefault(key.run, []).append(key)
    runs = []
    for run, run_keys in by_run.items():
        attempts = []
        parts: dict[int, list[tuple[Attempt, _Gather]]] = {}  # the attempts of each number (in-process iterations)
        for key in run_keys:
            number, gather = numbers[key], gathers[key]
            label = _label(key, number, run in restarted)
            attempt = Attempt(key, number, label, kept.get(key, {}), gather.verdict(), gather.overview())
            attempts.append(attempt)
            parts.setdefault(number, []).append((attempt, gather))
        drawn = []
        for number, its in parts.items():
            stem = re.sub(r"[^A-Za-z0-9._-]", "_", run.run_id) + "-" if several else ""
            stem += f"job{run.job + 1}-" if run.run_id in shared else ""
            shown_as = (f"run {run.run_id}: " if several or run.run_id in shared else "") + its[0][0].label
            if len(its) == 1:
                ranks, verdict, overview = its[0][0].ranks, its[0][0].verdict, its[0][0].overview
            else:
                into: Ranks = {}
                for part, _ in its:
                    for rank, rank_records in part.ranks.items():
                        into.setdefault(rank, []).extend(rank_records)
                ranks = dict(sorted(into.items()))
                merged = _Gather.of(ranks)
                verdict, overview = merged.verdict(), merged.overview()
            t0 = overview.t0 if overview.t0 is not None else 0.0
            drawn.append(Drawn(f"{stem}attempt{number}", shown_as, ranks, t0, verdict, overview))
        times = [a.overview.t0 for a in attempts if a.overview.t0 is not None]
        runs.append(Run(run, jobs_of[run.run_id], min(times, default=0.0), tuple(attempts), tuple(drawn)))
    return Model(tuple(runs), warnings)


class _Thinned:
    """A file's records as the views need them, as they are read: of each stretch of consecutive training steps and
    evaluations of one origin, only the first and last step, the step that ended latest and the last evaluation are
    passed on (in file order); every other record, and every ``Skipped``, as it comes. ``read``: the records taken in.

    What the views read of steps and evaluations is that much (a call's first and last step and last evaluation,
    a rank's latest time, the last step's end), so their output is the same, and a rank's 700,000 steps are four
    records: one long journal is read in the memory of a short one (see docs/benchmarks.md, show-long-journal).
    """

    def __init__(self, items: Iterable[Record | _journal.Skipped]) -> None:
        self.items = items
        self.read = 0

    def __iter__(self) -> Iterator[Record | _journal.Skipped]:
        origin: Origin | None = None  # the stretch's (records of one reading share their Origin object)
        kept: dict[str, tuple[int, Record]] = {}  # "first", "last", "latest" step, "eval": (position, record)
        latest = -math.inf
        for at, item in enumerate(self.items):
            if kept and (not isinstance(item, TrainStep | Eval) or item.origin is not origin):
                yield from _kept(kept)
                kept, latest = {}, -math.inf
            if isinstance(item, _journal.Skipped):
                yield item
                continue
            self.read += 1
            if isinstance(item, TrainStep):
                kept.setdefault("first", (at, item))
                kept["last"], origin = (at, item), item.origin
                if item.end is not None and item.end > latest:
                    kept["latest"], latest = (at, item), item.end
            elif isinstance(item, Eval):
                kept["eval"], origin = (at, item), item.origin
            else:
                yield item
        yield from _kept(kept)


def _kept(kept: Mapping[str, tuple[int, Record]]) -> list[Record]:
    """The records kept of a stretch, each once, in file order."""
    return [record for _, record in sorted(dict(kept.values()).items())]


@dataclass(frozen=True, slots=True)
class Scanned:
    """What ``scan`` read: the ``model``, the torn lines it skipped and the files it ignored (as ``journal.load``'s),
    how many ``records`` it read, and what else it ``skipped`` (``journal.Skipped``: without ``strict``)."""

    model: Model
    torn: tuple[str, ...]
    ignored: tuple[str, ...]
    records: int
    skipped: tuple[_journal.Skipped, ...] = ()


HELD = 10_000
"""The most records (thinned: see ``_Thinned``) ``scan`` holds while it reads, so as not to read the files of the
ranks shown again: more, and it holds none and reads those files again (16,384 ranks' journals hold millions)."""

_Held = dict[tuple[int, AttemptKey, int], list[Record]]
"""Records ``scan`` holds: by file index, attempt and rank."""


def scan(paths: Iterable[str | os.PathLike[str]], *, ranks: Iterable[int] = (), strict: bool = True) -> Scanned:
    """The model of the journals at ``paths`` (as ``journal.load`` reads them), read one record at a time.

    Of each rank of each attempt only its ``RankEnd`` and its part in the attempt's
    ``Overview`` are kept while the files are read; then the records of the ranks the views
    read (``shown``: at most ``TIMELINE_RANKS`` an attempt, ``MAX_ROWS`` and a few beyond)
    and of the ``ranks`` asked for are taken from what was held (up to ``HELD`` records), or
    their files are read again. Steps and evaluations are thinned as they are read
    (``_Thinned``): the views' output is the same, and a rank's long run of steps costs
    no memory. One journal file is open at a time, and memory holds one line, one
    file's thinned records and about a kilobyte a rank and attempt, however many ranks
    and records. Where that cannot tell the story (jobs that shared a run id, in-process
    iterations drawn together, a rank's records of one attempt in two files) every
    thinned record is read into memory and ``build`` decides, as before. Damaged lines and
    files: ``journal.stream``'s ``strict`` (with it, ``ValueError`` as ``journal.load``'s;
    without, skipped and said in ``skipped``). ``OSError`` as ``journal.load``'s.
    """
    paths, asked = list(paths), set(ranks)
    gathers: dict[AttemptKey, _Gather] = {}
    files: list[pathlib.Path] = []
    starts: list[tuple[int, RunStart]] = []
    ids: dict[str, None] = {}
    torn: list[str] = []
    ignored: list[str] = []
    skipped: list[_journal.Skipped] = []
    held: _Held | None = {}
    count, holding, whole = 0, 0, False
    for path, notes in _journal.each_file(paths):
        ignored += notes
        if path.is_dir():
            continue
        here = len(files)
        of_rank: dict[tuple[AttemptKey, int], list[Record]] = {}
        keys: dict[Origin, AttemptKey] = {}
        origin: Origin | None = None
        into: list[Record] = []
        thinned = _Thinned(_journal.stream(path, strict=strict))
        for r in thinned:
            if isinstance(r, _journal.Skipped):
                if r.problem is _journal.Problem.TORN:
                    torn.append(f"{path}:{r.first}")
                else:
                    skipped.append(r)
                continue
            o = r.origin
            if o is not origin:
                key = keys.get(o)
                if key is None:
                    key = keys[o] = AttemptKey(
                        RunKey(o.run_id, 0), o.restart_count, o.attempt, o.restart_mode, o.iteration
                    )
                    ids.setdefault(o.run_id)
                into, origin = of_rank.setdefault((key, o.rank), []), o
            if isinstance(r, RunStart):
                starts.append((count + thinned.read, r))
            into.append(r)
        if not thinned.read:
            continue
        count += thinned.read
        files.append(path)
        for (key, rank), records in of_rank.items():
            gather = gathers.get(key)
            if gather is None:
                gather = gathers[key] = _Gather()
            whole = not gather.add(rank, records, here) or whole
            if held is not None:
                held[(here, key, rank)] = records
                holding += len(records)
                held = held if holding <= HELD else None
    whole = whole or any(_jobs_of_starts(starts).values())
    numbered = {(key.run, key.restart_count, key.attempt) for key in gathers}
    whole = whole or len(numbered) < len(gathers)  # in-process iterations: drawn together, from their records
    if whole:
        records = [r for path in files for r in _records_of(path, strict)]
        return Scanned(build(records), tuple(torn), tuple(ignored), count, tuple(skipped))
    wanted: dict[int, set[tuple[AttemptKey, int]]] = {}
    for key, gather in gathers.items():
        for rank in {*shown(gather.overview(), gather.verdict()), *(r for r in asked if r in gather.files)}:
            wanted.setdefault(gather.files[rank], set()).add((key, rank))
    kept: dict[AttemptKey, Ranks] = {}
    for index in sorted(wanted):
        if held is not None:
            for key, rank in wanted[index]:
                kept.setdefault(key, {})[rank] = held[(index, key, rank)]
            continue
        for r in _records_of(files[index], strict):
            o = r.origin
            key = AttemptKey(RunKey(o.run_id, 0), o.restart_count, o.attempt, o.restart_mode, o.iteration)
            if (key, o.rank) in wanted[index]:
                kept.setdefault(key, {}).setdefault(o.rank, []).append(r)
    kept = {key: dict(sorted(ranks.items())) for key, ranks in kept.items()}
    model = _assemble({key: gathers[key] for key in _ordered(gathers)}, kept, _warnings(list(ids), {}))
    return Scanned(model, tuple(torn), tuple(ignored), count, tuple(skipped))


def _records_of(path: pathlib.Path, strict: bool) -> Iterator[Record]:
    """The records of the journal at ``path``, thinned (``_Thinned``), read again: what was skipped was said."""
    for r in _Thinned(_journal.stream(path, strict=strict)):
        if not isinstance(r, _journal.Skipped):
            yield r
