"""``python -m lifecycle show JOURNAL...``: a run's timeline, and the diagram of the path it took.

Per attempt, a verdict comes first (``lifecycle._tools.verdict``): which rank failed
first, by the store's sequence number where the ranks journaled their failure notices,
otherwise by wall time, and how every other rank ended, grouped, in at most 24 lines.
Then the timeline lists, per attempt and per rank, every transition and teardown step
with its time relative to the start of the run. The attempts of a run are ordered by
torchrun's restart count, then by ``pretrain``'s attempt number: the workers torchrun
restarts count their attempts from 0 again, and show numbers them on from the
attempts before (``attempt 2 (torchrun restart 1)``). The diagrams are the lifecycle diagrams of
``lifecycle._tools.diagrams`` (generated from ``TRANSITIONS``) with the edges the run took
highlighted: one Mermaid and one Graphviz file per attempt, rendered to SVG and PNG
when Graphviz's ``dot`` is installed; next to them, a Mermaid gantt chart of each
attempt (``lifecycle._tools.gantt``), and with ``--html PATH`` one self-contained page
of it all (``lifecycle._tools.page``).

Real-world journals: torn lines are skipped with a note naming file and line; a line
that breaks the schema ends ``show`` with ``file:line: field 'x' ...`` (exit 2), never a
traceback; journals of different runs, and of jobs that shared a run id, are shown as
separate runs with a warning, never merged; a closed stdout (``| head``) ends it quietly
(see ``show_main``).
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from lifecycle import journal as _journal
from lifecycle._core.states import State, Trigger
from lifecycle._core.table import TRANSITIONS, Edge
from lifecycle._tools import diagrams as _diagrams
from lifecycle._tools import gantt as _gantt
from lifecycle._tools import page as _page
from lifecycle._tools import verdict as _verdict
from lifecycle.journal import Eval, Left, Record, RunEnd, RunStart, TeardownStep, TrainStep, Transition

CLOSED_PIPE = 141
"""The exit code of a command whose stdout was closed before it was done (128 + SIGPIPE); ``cli`` uses it too."""

Attempt = tuple[str, int, int, int, str, int]
"""An attempt's identity: run id, job (0, or more where jobs shared the run id), torchrun restart count, attempt
number, restart mode, iteration."""


def _short(text: str, limit: int = 160) -> str:
    """The first line of ``text``, cut to ``limit`` characters (gloo's errors run long)."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _named(kind: str, name: str) -> str:
    """``kind:name`` for a named resource (or its step), ``kind`` alone for the others."""
    return f"{kind}:{name}" if name else kind


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _events(call: list[Record]) -> list[tuple[float, str]]:
    """The timed lines of one call: ``(start, text)`` for its start, transitions, teardown steps and last step."""
    events: list[tuple[float, str]] = []
    for r in call:
        if isinstance(r, RunStart):
            o = r.origin
            text = f"pretrain started (pid {r.pid} on {r.host}, restart mode {o.restart_mode}, iteration {o.iteration})"
            events.append((r.start, text))
        elif isinstance(r, Transition):
            text = f"{r.source} → {r.dest}  [{r.trigger}, {_ms(r.end - r.start)}]"
            if r.agreed_attempt is not None:
                text += f"  agreed attempt {r.agreed_attempt}"
            if r.store_prefix is not None:
                text += f"  store prefix {r.store_prefix}"
            why = f"  {_short(r.detail)}" if r.detail and r.dest == State.FAILED.value else ""
            events.append((r.start, text + why))
        elif isinstance(r, TeardownStep):
            failed = f"  FAILED: {_short(r.error)}" if r.error else ""
            verb = {"reclaim": "reclaim ", "abandoned": "abandon "}.get(r.outcome, "teardown")
            note = f"  ({r.note})" if r.note else ""
            step = _named(r.step, r.name)
            events.append((r.start, f"    {verb} {step:<32} {_ms(r.end - r.start)}{failed}{note}"))
    steps = [r for r in call if isinstance(r, TrainStep)]
    last = steps[-1] if steps else None
    if last is not None and last.end is not None:
        events.append((last.end, f"step {last.step} ended (the last recorded; loss {last.loss:.3f})"))
    return sorted(events, key=lambda event: event[0])


def _earliest(records: list[Record]) -> float | None:
    """The earliest time ``_events(records)`` would list (without building its lines); None if it lists none."""
    times = [r.start for r in records if isinstance(r, RunStart | Transition | TeardownStep)]
    last = next((r for r in reversed(records) if isinstance(r, TrainStep)), None)
    if last is not None and last.end is not None:
        times.append(last.end)
    return min(times, default=None)


def _summary(call: list[Record]) -> str:
    """One line on how a call ended, its losses and checkpoint; a call without an end record was cut short."""
    ends = [r for r in call if isinstance(r, RunEnd)]
    steps = [r for r in call if isinstance(r, TrainStep)]
    evals = [r for r in call if isinstance(r, Eval)]
    if ends:
        end = ends[-1]
        how = f": {_short(end.error)}" if end.error else f" (exit: {end.exit_reason})"
        head = f"ended {end.state} after step {end.final_step}{how}"
    else:
        states = [r.dest for r in call if isinstance(r, Transition)]
        state = states[-1] if states else State.UNINITIALIZED.value
        last = f"last step {steps[-1].step}" if steps else "no training step recorded"
        head = f"no end record (killed?) in state {state} — {last}"
    if steps:
        first, last_step = steps[0], steps[-1]
        head += f"; loss {first.loss:.3f} (step {first.step}) → {last_step.loss:.3f} (step {last_step.step})"
    if evals:
        head += f"; eval loss {evals[-1].loss:.3f}"
    if ends and ends[-1].checkpoint_step is not None:
        head += f"; checkpoint step {ends[-1].checkpoint_step}"
    return head


def _jobs(records: list[Record]) -> list[int]:
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


def _by_attempt(records: list[Record]) -> dict[Attempt, dict[int, list[Record]]]:
    """Records grouped by attempt, then by rank.

    Runs come in order of first appearance, the jobs of a shared run id in turn (see
    ``_jobs``); a job's attempts by (torchrun restart count, attempt number), then in
    order of first appearance (in-process iterations).
    """
    grouped: dict[Attempt, dict[int, list[Record]]] = {}
    for r, job in zip(records, _jobs(records), strict=True):
        o = r.origin
        key = (o.run_id, job, o.restart_count, o.attempt, o.restart_mode, o.iteration)
        grouped.setdefault(key, {}).setdefault(o.rank, []).append(r)
    runs = list(dict.fromkeys(run_id for run_id, *_ in grouped))
    order = sorted(grouped, key=lambda key: (runs.index(key[0]), *key[1:4]))  # stable: iterations keep order
    return {key: dict(sorted(grouped[key].items())) for key in order}


def run_warnings(records: list[Record]) -> list[str]:
    """What to warn of before a timeline: journals of several runs, or of several jobs that shared a run id.

    Either way each run (job) is shown on its own, never as attempts of one run.
    """
    ids = list(dict.fromkeys(r.origin.run_id for r in records))
    warnings = []
    if len(ids) > 1:
        warnings.append(
            f"these journals are of {len(ids)} different runs ({', '.join(ids)}): each is shown as a run of its own"
        )
    jobs: dict[str, set[int]] = {}
    for r, job in zip(records, _jobs(records), strict=True):
        jobs.setdefault(r.origin.run_id, set()).add(job)
    for run_id, its_jobs in jobs.items():
        if len(its_jobs) > 1:
            warnings.append(
                f"run id {run_id} was used by {len(its_jobs)} jobs (a rank started the same attempt again):"
                " each is shown as a run of its own, in order of start time"
            )
    return warnings


def _numbers(attempts: Iterable[Attempt]) -> dict[Attempt, int]:
    """The number show gives each attempt: its own until torchrun restarts, then one more than the run's last.

    Within a run (a job), in the order given (``_by_attempt``'s): ``max(attempt, previous + 1)``
    per distinct (restart count, attempt), so a run that torchrun never restarted keeps
    its attempt numbers, and a restarted worker's attempt 0 follows the attempts before.
    """
    numbers: dict[Attempt, int] = {}
    last: dict[tuple[str, int], tuple[tuple[int, int], int]] = {}  # per job: the last (restarts, attempt), its number
    for key in attempts:
        run_id, job, restarts, attempt = key[:4]
        seen = last.get((run_id, job))
        if seen is not None and seen[0] == (restarts, attempt):
            number = seen[1]
        else:
            number = attempt if seen is None else max(attempt, seen[1] + 1)
        last[(run_id, job)] = ((restarts, attempt), number)
        numbers[key] = number
    return numbers


def _label(key: Attempt, number: int, restarted: bool) -> str:
    """``attempt N``, noting the torchrun restart (in a ``restarted`` run), the call's own number, the restart mode."""
    _, _, restarts, attempt, mode, iteration = key
    notes = []
    if restarted:
        notes.append(f"torchrun restart {restarts}")
    if restarts > 0 and attempt > 0:  # a restarted worker's first call is its attempt 0: said only otherwise
        notes.append(f"pretrain attempt {attempt}")
    if mode != "ordinary" or iteration != 0:
        notes.append(f"restart mode {mode}, iteration {iteration}")
    return f"attempt {number}" + (f" ({', '.join(notes)})" if notes else "")


def _split_calls(records: list[Record]) -> list[list[Record]]:
    """One rank's records of one attempt, split into ``pretrain`` calls (each starts with a ``RunStart``)."""
    calls: list[list[Record]] = []
    for record in records:
        if isinstance(record, RunStart) or not calls:
            calls.append([])
        calls[-1].append(record)
    return calls


def verdict_lines(ranks: dict[int, list[Record]]) -> list[str]:
    """One attempt's verdict (``lifecycle._tools.verdict``), at most 24 lines, each indented: ``  verdict: ...``."""
    lines = _verdict.analyse(ranks).lines()
    return [f"  verdict: {line}" if i == 0 else f"  {'':9}{line}" for i, line in enumerate(lines)]


def timeline_lines(records: list[Record], *, verdicts: bool = False) -> list[str]:
    """The timeline: per run id, per attempt, per rank, every event with its time since the run's first event.

    Runs of different run ids are shown one after the other, never merged; so are
    jobs that shared a run id (``run X (job 2 of 2 with this run id)``; see ``_jobs``).

    Each rank's line says how its call ended, or, without an end record (a killed or
    hung rank), the state it reached and the last training step it recorded. With
    ``verdicts``, each attempt's verdict (``verdict_lines``) comes first, before its ranks.
    """
    if not records:
        return ["(no journal records)"]
    lines: list[str] = []
    run: tuple[str, int] | None = None
    t0 = 0.0
    grouped = _by_attempt(records)
    numbers = _numbers(grouped)
    restarted = {key[:2] for key in grouped if key[2] > 0}
    jobs = {run_id: 1 + max(key[1] for key in grouped if key[0] == run_id) for run_id, *_ in grouped}
    for key, ranks in grouped.items():
        if key[:2] != run:
            run = key[:2]
            rid, job = run
            starts = [
                _earliest(rank_records) for k, rs in grouped.items() if k[:2] == run for rank_records in rs.values()
            ]
            t0 = min((t for t in starts if t is not None), default=0.0)
            lines.append(f"run {rid}" + (f" (job {job + 1} of {jobs[rid]} with this run id)" if jobs[rid] > 1 else ""))
        lines.append(_label(key, numbers[key], key[:2] in restarted))
        if verdicts:
            lines += verdict_lines(ranks)
        lines += _rank_lines(ranks, t0)
    return lines


def _rank_lines(ranks: dict[int, list[Record]], t0: float) -> list[str]:
    """One attempt's ranks: per ``pretrain`` call, how it ended, then its events timed from ``t0``."""
    lines: list[str] = []
    for rank, rank_records in ranks.items():
        for call in _split_calls(rank_records):
            lines.append(f"  rank {rank}: {_summary(call)}")
            lines += [f"  {t - t0:+9.3f}s  {text}" for t, text in _events(call)]
            lines += [
                f"  {'':11}      left alone: {_named(r.resource, r.name)} (owner: {r.owner}): {r.reason}"
                + (f" (acquired at {r.site})" if r.site else "")
                for r in call
                if isinstance(r, Left)
            ]
    return lines


def final_states(records: list[Record]) -> dict[int, str]:
    """Each rank's state at the end of its last ``pretrain`` call (``closed``, ``failed``, or ``?`` if cut short)."""
    states: dict[int, str] = {}
    for record in records:
        if isinstance(record, RunStart):
            states[record.origin.rank] = "?"
        elif isinstance(record, RunEnd):
            states[record.origin.rank] = record.state
    return dict(sorted(states.items()))


def taken_edges(records: Iterable[Record]) -> frozenset[Edge]:
    """The declared edges the transition records took (a record naming no declared edge is ignored)."""
    named = {(r.trigger, r.source, r.dest) for r in records if isinstance(r, Transition)}
    taken = set()
    for trigger, source, dest in named:
        try:
            edge = Edge(Trigger(trigger), State(source), State(dest))
        except ValueError:
            continue
        if edge in TRANSITIONS:
            taken.add(edge)
    return frozenset(taken)


@dataclass(frozen=True, slots=True)
class _Drawn:
    """One numbered attempt as drawn: file name stem, label, and each rank's records (its iterations merged)."""

    stem: str
    label: str
    ranks: dict[int, list[Record]]
    t0: float


def _drawn(records: list[Record]) -> list[_Drawn]:
    """The attempts ``write_diagrams`` draws, one per attempt number of each run (job)."""
    grouped = _by_attempt(records)
    numbers = _numbers(grouped)
    restarted = {key[:2] for key in grouped if key[2] > 0}
    attempts: dict[tuple[str, int, int], dict[int, list[Record]]] = {}
    labels: dict[tuple[str, int, int], str] = {}
    for key, ranks in grouped.items():
        where = (key[0], key[1], numbers[key])
        labels.setdefault(where, _label(key, numbers[key], key[:2] in restarted))
        merged = attempts.setdefault(where, {})
        for rank, rank_records in ranks.items():
            merged.setdefault(rank, []).extend(rank_records)
    several = len({run_id for run_id, _, _ in attempts}) > 1
    shared = {run_id for run_id, job, _ in attempts if job > 0}
    drawn = []
    for (run_id, job, number), ranks in attempts.items():
        prefix = re.sub(r"[^A-Za-z0-9._-]", "_", run_id) + "-" if several else ""
        prefix += f"job{job + 1}-" if run_id in shared else ""
        label = (f"run {run_id}: " if several or run_id in shared else "") + labels[(run_id, job, number)]
        times = [t for t in map(_earliest, ranks.values()) if t is not None]
        drawn.append(_Drawn(f"{prefix}attempt{number}", label, dict(sorted(ranks.items())), min(times, default=0.0)))
    return drawn


def write_diagrams(records: list[Record], out: Path) -> list[Path]:
    """Write, per attempt, ``attempt<N>.mmd``, ``attempt<N>.dot`` (plus ``.svg``, ``.png`` if ``dot`` exists) and
    ``attempt<N>-gantt.mermaid``.

    ``N`` is the attempt's number in the timeline (torchrun's restarts numbered on);
    each state diagram highlights the edges any rank took in that attempt (in any of its
    in-process iterations); the gantt chart (``lifecycle._tools.gantt``) draws its ranks'
    states and teardown steps on one time axis, the first failure marked. With several
    run ids the names start ``<run id>-``; where jobs shared a run id, then ``job<J>-``
    (1, 2, ...). Returns the paths written.
    A rendering failure is reported on stderr and skipped: the sources are still written.
    """
    out.mkdir(parents=True, exist_ok=True)
    dot_exe = shutil.which("dot")
    written: list[Path] = []
    for drawn in _drawn(records):
        taken = taken_edges(r for rank_records in drawn.ranks.values() for r in rank_records)
        mmd = out / f"{drawn.stem}.mmd"
        mmd.write_text(_diagrams.mermaid(taken), encoding="utf-8")
        source = mmd.with_suffix(".dot")
        source.write_text(_diagrams.dot(taken), encoding="utf-8")
        chart = out / f"{drawn.stem}-gantt.mermaid"
        chart.write_text(_gantt.gantt(drawn.ranks, drawn.label, _verdict.analyse(drawn.ranks)), encoding="utf-8")
        written += [mmd, source, chart]
        if dot_exe is None:
            continue
        for fmt in ("svg", "png"):
            image = source.with_suffix(f".{fmt}")
            try:
                subprocess.run(
                    [dot_exe, f"-T{fmt}", "-o", str(image), str(source)], check=True, capture_output=True, timeout=60
                )
            except (OSError, subprocess.SubprocessError) as exc:
                print(f"could not render {image} with {dot_exe}: {exc}", file=sys.stderr)
            else:
                written.append(image)
    return written


def write_page(records: list[Record], path: Path, diagrams: Path | None = None) -> Path:
    """Write the self-contained HTML page of ``records`` to ``path`` (``lifecycle._tools.page``); return ``path``.

    Per attempt: its verdict, gantt chart, highlighted state diagram and timeline (timed
    from the attempt's first event, where the printed timeline times from the run's). The
    mermaid bundle is inlined where installed (``page.mermaid_bundle``); the Graphviz
    SVG of an attempt is inlined where ``diagrams`` holds one (``write_diagrams``'s).
    ``OSError`` if it cannot be written.
    """
    sections = []
    for drawn in _drawn(records):
        taken = taken_edges(r for rank_records in drawn.ranks.values() for r in rank_records)
        analysis = _verdict.analyse(drawn.ranks)
        svg_path = diagrams / f"{drawn.stem}.svg" if diagrams is not None else None
        svg = svg_path.read_text(encoding="utf-8") if svg_path is not None and svg_path.is_file() else None
        sections.append(
            _page.Section(
                label=drawn.label,
                verdict=analysis.lines(),
                timeline=_rank_lines(drawn.ranks, drawn.t0),
                gantt=_gantt.gantt(drawn.ranks, drawn.label, analysis),
                state=_diagrams.mermaid(taken),
                svg=svg,
            )
        )
    run_ids = ", ".join(dict.fromkeys(r.origin.run_id for r in records))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_page.page(f"lifecycle run {run_ids}", sections, _page.mermaid_bundle()), encoding="utf-8")
    return path


def drop_stdout() -> None:
    """Send the rest of stdout to ``os.devnull`` (after a ``BrokenPipeError``), so no later flush raises."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def print_or_drop(text: str) -> bool:
    """Print ``text`` to stdout and flush; False, with stdout dropped (``drop_stdout``), if the reader has gone."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        drop_stdout()
        return False
    return True


def show_main(argv: list[str]) -> int:
    """``show JOURNAL... [--out DIR] [--html PATH]``: print the verdicts and timeline, write the diagrams.

    Returns the exit code. Per attempt, the verdict (``verdict_lines``: which rank failed
    first, how the others ended) comes before its ranks' timelines. ``--html PATH``
    also writes the self-contained page of ``write_page`` to ``PATH``.

    A JOURNAL may be a journal file (read whatever its name) or a folder, which stands
    for its ``rank<R>.jsonl`` files (other ``*.jsonl`` files in it that look like
    journals are noted on stderr and not read), version 2 or 1. A torn line (its
    writer killed mid-write), wherever it is, is skipped and noted on stderr with its
    file and line. Journals of different runs, or of jobs that shared a run id, are
    shown as separate runs, with a warning on stderr. Diagrams go to ``--out``
    (default: the folder of the first journal).

    Exit code 0; 2 when a journal cannot be read (``file:line: ...``: not UTF-8, not
    JSON, a record that breaks the schema, ``field 'x' ...``), holds no record, or the
    diagrams cannot be written; 141 (128 + SIGPIPE, what a shell reports for a tool a
    closed pipe stopped) when stdout was closed early (``show ... | head``): the
    rest of the output is dropped quietly and the diagrams are still written.
    """
    parser = argparse.ArgumentParser(
        prog="python -m lifecycle show",
        description=(
            "Print, per attempt, the verdict (which rank failed first, how every rank ended) and the timeline of a run"
            " from its journals; draw the lifecycle path it took and a gantt chart of each attempt."
        ),
    )
    parser.add_argument("journals", nargs="+", type=Path, metavar="JOURNAL", help="rank<R>.jsonl files or folders")
    parser.add_argument("--out", type=Path, help="where to write the diagrams (default: next to the journal)")
    parser.add_argument(
        "--html",
        type=Path,
        metavar="PATH",
        help="also write one self-contained HTML page (verdicts, diagrams, timelines) to PATH; it opens offline",
    )
    args = parser.parse_args(argv)
    for stream in (sys.stdout, sys.stderr):  # a file name that is not UTF-8 must not end the report
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
    try:
        loaded = _journal.load(args.journals)
    except (OSError, ValueError) as exc:
        print(f"cannot read the journal: {exc}", file=sys.stderr)
        return 2
    for note in loaded.ignored:
        print(note, file=sys.stderr)
    for where in loaded.torn:
        print(f"{where}: torn line skipped (its writer was killed mid-write?)", file=sys.stderr)
    records = list(loaded.records)
    if not records:
        print(f"no journal records in {', '.join(map(str, args.journals))}", file=sys.stderr)
        return 2
    for warning in run_warnings(records):
        print(f"warning: {warning}", file=sys.stderr)
    closed = not print_or_drop("\n".join(timeline_lines(records, verdicts=True)))
    first = args.journals[0]
    out = args.out if args.out is not None else (first if first.is_dir() else first.parent)
    try:
        written = write_diagrams(records, out)
    except OSError as exc:
        print(f"cannot write the diagrams to {out}: {exc}", file=sys.stderr)
        return 2
    if args.html is not None:
        try:
            written.append(write_page(records, args.html, out))
        except OSError as exc:
            print(f"cannot write the page to {args.html}: {exc}", file=sys.stderr)
            return 2
    for path in written:
        closed = not print_or_drop(f"wrote {path}") or closed
    return CLOSED_PIPE if closed else 0


if __name__ == "__main__":
    sys.exit(show_main(sys.argv[1:]))
