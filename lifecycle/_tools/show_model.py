"""What ``show`` shows, apart from how: journal records grouped into runs, jobs and attempts, each with its verdict.

``build(records)`` returns a ``Model``: its ``runs`` in order of first appearance (the
jobs of a shared run id in turn, see ``job_of_each``), each with its ``attempts`` (one
per ``AttemptKey``: torchrun restart count, ``pretrain`` attempt, restart mode and
in-process iteration, ordered by restart count then attempt number) and its ``drawn``
attempts (one per attempt number, in-process iterations merged: what a chart shows).
Attempts are numbered on across torchrun restarts (``number``), since a restarted
worker counts its attempts from 0 again. Every attempt carries its ranks' records
and its verdict (``lifecycle._tools.verdict``). The views (``show``'s text, the
diagrams and gantt charts, the HTML page) read only this model.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from lifecycle._tools import verdict as _verdict
from lifecycle.journal import Record, RunStart, TeardownStep, TrainStep, Transition


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


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt: its ``key``, the ``number`` show gives it, its ``label``, its ranks' records and its verdict."""

    key: AttemptKey
    number: int
    label: str
    ranks: Ranks
    verdict: _verdict.Verdict


@dataclass(frozen=True, slots=True)
class Drawn:
    """One numbered attempt as a chart draws it, its in-process iterations merged.

    ``stem``: its files' name stem (``attempt2``, ``<run id>-job2-attempt0``); ``label``;
    ``ranks``; ``t0``: its first event's time; ``verdict`` on the merged records.
    """

    stem: str
    label: str
    ranks: Ranks
    t0: float
    verdict: _verdict.Verdict


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
    starts: dict[str, list[tuple[float, int, RunStart]]] = {}
    for index, r in enumerate(records):
        if isinstance(r, RunStart):
            starts.setdefault(r.origin.run_id, []).append((r.start, index, r))
    job_of_start: dict[int, int] = {}
    for run_starts in starts.values():
        job, seen = 0, set[tuple[int, int, int, str, int]]()
        for _, index, r in sorted(run_starts, key=lambda s: (s[0], s[1])):
            o = r.origin
            key = (o.rank, o.restart_count, o.attempt, o.restart_mode, o.iteration)
            if key in seen:
                job, seen = job + 1, set()
            seen.add(key)
            job_of_start[index] = job
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


def _grouped(records: Sequence[Record], jobs: Sequence[int]) -> dict[AttemptKey, Ranks]:
    """Records grouped by attempt, then by rank: runs in order of first appearance, each run's attempts by
    (restart count, attempt number), then in order of first appearance (in-process iterations)."""
    grouped: dict[AttemptKey, Ranks] = {}
    for r, job in zip(records, jobs, strict=True):
        o = r.origin
        key = AttemptKey(RunKey(o.run_id, job), o.restart_count, o.attempt, o.restart_mode, o.iteration)
        grouped.setdefault(key, {}).setdefault(o.rank, []).append(r)
    runs = {run_id: i for i, run_id in enumerate(dict.fromkeys(key.run.run_id for key in grouped))}
    order = sorted(grouped, key=lambda k: (runs[k.run.run_id], k.run.job, k.restart_count, k.attempt))  # stable
    return {key: dict(sorted(grouped[key].items())) for key in order}


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


def _warnings(records: Sequence[Record], jobs: Sequence[int]) -> tuple[str, ...]:
    """Journals of several runs, or of several jobs that shared a run id: each is shown on its own."""
    ids = list(dict.fromkeys(r.origin.run_id for r in records))
    warnings = []
    if len(ids) > 1:
        warnings.append(
            f"these journals are of {len(ids)} different runs ({', '.join(ids)}): each is shown as a run of its own"
        )
    of_run: dict[str, set[int]] = {}
    for r, job in zip(records, jobs, strict=True):
        of_run.setdefault(r.origin.run_id, set()).add(job)
    for run_id, its_jobs in of_run.items():
        if len(its_jobs) > 1:
            warnings.append(
                f"run id {run_id} was used by {len(its_jobs)} jobs (a rank started the same attempt again):"
                " each is shown as a run of its own, in order of start time"
            )
    return tuple(warnings)


def _t0(rank_lists: Sequence[Sequence[Record]]) -> float:
    """The earliest time of any of these ranks' records (0.0 if none is timed)."""
    return min((t for t in map(earliest, rank_lists) if t is not None), default=0.0)


def build(records: Sequence[Record]) -> Model:
    """The model of ``records`` (any journals' records, in file order): runs, jobs, attempts, verdicts, warnings."""
    jobs = job_of_each(records)
    grouped = _grouped(records, jobs)
    numbers = _numbers(list(grouped))
    restarted = {key.run for key in grouped if key.restart_count > 0}
    several = len({key.run.run_id for key in grouped}) > 1
    shared = {key.run.run_id for key in grouped if key.run.job > 0}
    jobs_of = {key.run.run_id: 1 + max(k.run.job for k in grouped if k.run.run_id == key.run.run_id) for key in grouped}
    by_run: dict[RunKey, list[AttemptKey]] = {}
    for key in grouped:
        by_run.setdefault(key.run, []).append(key)
    runs = []
    for run, keys in by_run.items():
        attempts = []
        parts: dict[int, list[Attempt]] = {}  # the attempts of each number (in-process iterations: several)
        for key in keys:
            ranks, number = grouped[key], numbers[key]
            attempt = Attempt(key, number, _label(key, number, run in restarted), ranks, _verdict.analyse(ranks))
            attempts.append(attempt)
            parts.setdefault(number, []).append(attempt)
        drawn = []
        for number, its in parts.items():
            stem = re.sub(r"[^A-Za-z0-9._-]", "_", run.run_id) + "-" if several else ""
            stem += f"job{run.job + 1}-" if run.run_id in shared else ""
            shown = (f"run {run.run_id}: " if several or run.run_id in shared else "") + its[0].label
            if len(its) == 1:
                ranks, verdict = its[0].ranks, its[0].verdict
            else:
                into: Ranks = {}
                for part in its:
                    for rank, rank_records in part.ranks.items():
                        into.setdefault(rank, []).extend(rank_records)
                ranks = dict(sorted(into.items()))
                verdict = _verdict.analyse(ranks)
            drawn.append(Drawn(f"{stem}attempt{number}", shown, ranks, _t0(list(ranks.values())), verdict))
        t0 = _t0([rs for key in keys for rs in grouped[key].values()])
        runs.append(Run(run, jobs_of[run.run_id], t0, tuple(attempts), tuple(drawn)))
    return Model(tuple(runs), _warnings(records, jobs))
