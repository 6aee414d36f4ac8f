"""``python -m lifecycle show JOURNAL...``: a run's timeline, and the diagram of the path it took.

What is shown comes from the model of the journals (``lifecycle._tools.show.model``:
runs, jobs, attempts and their verdicts), built once (``model.build`` of records,
``model.scan`` of files); every view takes that model and reads nothing else:
``render_timeline`` (the text), ``write_diagrams`` (the state diagrams and gantt
charts), ``write_page`` (the HTML page, with ``svg``'s drawings).

Per attempt, a verdict comes first (``lifecycle._tools.show.verdict``): which rank failed
first, by the store's sequence number where the ranks journaled their failure notices,
otherwise by wall time, and how every other rank ended, grouped, in at most 24 lines.
Then the timeline lists, per attempt and per rank, every transition and teardown step
with its time relative to the start of the run; past ``model.TIMELINE_RANKS`` (64)
ranks an attempt, the cause's rank and one rank of each group of ranks that ended alike
(the verdict's groups), each under a line naming its group. ``show`` reads the journals
one file at a time (``model.scan``): what it keeps of a rank is its end and its part
of the attempt's overview, so 16,384 ranks' journals take the memory of a few. The attempts of a run are ordered by
torchrun's restart count, then by ``pretrain``'s attempt number: the workers torchrun
restarts count their attempts from 0 again, and show numbers them on from the
attempts before (``attempt 2 (torchrun restart 1)``). The diagrams are the lifecycle diagrams of
``lifecycle._tools.diagrams.draw`` (generated from ``TRANSITIONS``) with the edges the run took
highlighted: one Mermaid and one Graphviz file per attempt, rendered to SVG and PNG
when Graphviz's ``dot`` is installed; next to them, a Mermaid gantt chart of each
attempt (``lifecycle._tools.show.gantt``), and with ``--html PATH`` one self-contained page
of it all (``lifecycle._tools.show.page``).

Real-world journals: torn lines are skipped with a note naming file and line; damaged
lines and files (records of an unknown kind, lines that are not JSON, records that break
the schema, NUL bytes a crash left, a binary file) are skipped with one warning per
problem of a file (``skipped_text``), and the rest is shown; with ``--strict`` the first
such line ends ``show`` with ``file:line: field 'x' ...`` (exit 2), never a traceback;
journals of different runs, and of jobs that shared a run id, are shown as separate
runs with a warning, never merged; a closed stdout (``| head``) ends it quietly
(see ``show_main``).
"""

from __future__ import annotations

import argparse
import errno
import io
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from lifecycle._core.states import State, Trigger
from lifecycle._core.table import TRANSITIONS, Edge
from lifecycle._tools.diagrams import draw as _diagrams
from lifecycle._tools.show import gantt as _gantt
from lifecycle._tools.show import model as _model
from lifecycle._tools.show import page as _page
from lifecycle._tools.show import svg as _svg
from lifecycle._tools.show import verdict as _verdict
from lifecycle._tools.show.calls import events as _events
from lifecycle._tools.show.calls import named as _named
from lifecycle._tools.show.calls import summary as _summary
from lifecycle._tools.show.cause import ranks_text
from lifecycle._tools.show.collectives import collective_lines
from lifecycle._training.decide import Decision
from lifecycle._training.retry import decision_key, recorded_decisions
from lifecycle.journal import (
    JobDecision,
    Left,
    Problem,
    Record,
    RunEnd,
    RunStart,
    Skipped,
)

CLOSED_PIPE = 141
"""The exit code of a command whose stdout was closed before it was done (128 + SIGPIPE); ``cli`` uses it too."""


def _split_calls(records: list[Record]) -> list[list[Record]]:
    """One rank's records of one attempt, split into ``pretrain`` calls (each starts with a ``RunStart``)."""
    calls: list[list[Record]] = []
    for record in records:
        if isinstance(record, RunStart) or not calls:
            calls.append([])
        calls[-1].append(record)
    return calls


def _verdict_lines(verdict: _verdict.Verdict) -> list[str]:
    lines = verdict.lines()
    return [f"  verdict: {line}" if i == 0 else f"  {'':9}{line}" for i, line in enumerate(lines)]


def render_timeline(
    model: _model.Model,
    *,
    verdicts: bool = False,
    ranks: Iterable[int] = (),
    decisions: Mapping[tuple[str, int, int], Decision] | None = None,
) -> list[str]:
    """The timeline: per run, per attempt, per rank, every event with its time since the run's first event.

    Runs of different run ids are shown one after the other, never merged; so are
    jobs that shared a run id (``run X (job 2 of 2 with this run id)``).

    Each rank's line says how its call ended, or, without an end record (a killed or
    hung rank), the state it reached and the last training step it recorded. With
    ``verdicts``, each attempt's verdict (at most 24 lines, under ``  verdict:``) comes first, before its ranks.
    An attempt of more than ``model.TIMELINE_RANKS`` journaled ranks lists the rows
    its charts draw (``model.chart_rows``): the cause's rank, those that failed
    independently, then one rank of each group of ranks that ended alike, under a line
    ``ranks 0, 2-1023 (1023 ranks), as rank 0:``; groups past ``MAX_ROWS`` are counted;
    then the ``ranks`` asked for (whose records the model holds: every rank's from
    ``build``, those asked of ``scan``). A failed attempt's decision, its ``decision`` record (or, for a journal
    without one, ``decisions``: ``retry.recorded_decisions``), is one line after its verdict
    (``  decision after attempt 1: stop (reproducible): ...``); then, where ranks recorded them, one line per process
    group: where each rank stood in its collectives (``collectives.collective_lines``).
    """
    lines: list[str] = []
    asked = sorted(set(ranks))
    for run in model.runs:
        job = f" (job {run.key.job + 1} of {run.jobs} with this run id)" if run.jobs > 1 else ""
        lines.append(f"run {run.key.run_id}{job}")
        for attempt in run.attempts:
            lines.append(attempt.label)
            if verdicts:
                lines += _verdict_lines(attempt.verdict)
            key = decision_key(run.key.run_id, attempt.key.restart_count, attempt.key.attempt)
            said = [r.line() for rs in attempt.ranks.values() for r in rs if isinstance(r, JobDecision)]
            if not said and decisions and key in decisions and attempt.key.iteration == 0:
                said = [decisions[key].line()]  # a journal written before its decision record: the folder's
            lines += [f"  decision after attempt {attempt.number}: {line}" for line in said]
            lines += collective_lines(attempt.ranks)
            if len(attempt.overview.journaled) <= _model.TIMELINE_RANKS:
                lines += _rank_lines(attempt.ranks, run.t0)
            else:
                lines += _grouped_lines(attempt, run.t0, asked)
    return lines


def _grouped_lines(attempt: _model.Attempt, t0: float, asked: Sequence[int]) -> list[str]:
    """An attempt of more than ``TIMELINE_RANKS`` ranks: the cause's and the independent failures' timelines, then
    one rank's for each group of ranks that ended alike (the verdict's groups, as the charts draw them), under a line
    naming the group; the groups past ``MAX_ROWS`` counted."""
    rows, left_out = _model.chart_rows(attempt.overview.journaled, attempt.verdict)
    cause = ", the cause's first" if attempt.verdict.first is not None else ""
    lines = [f"  ({len(attempt.overview.journaled)} ranks: one timeline for each group that ended alike{cause})"]
    for row in rows:
        group = row.group
        if group is not None and len(group.ranks) > 1:
            lines.append(f"  {ranks_text(group.ranks)} ({len(group.ranks)} ranks), as rank {row.rank}:")
        lines += _rank_lines({row.rank: attempt.ranks[row.rank]}, t0)
    if left_out:
        lines.append(f"  … and {left_out} more groups of ranks, not shown (the verdict lists them)")
    drawn = {row.rank for row in rows}
    for rank in (rank for rank in asked if rank in attempt.ranks and rank not in drawn):
        lines.append(f"  rank {rank}, as asked:")
        lines += _rank_lines({rank: attempt.ranks[rank]}, t0)
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


def _taken(overview: _model.Overview) -> frozenset[Edge]:
    """The declared edges the ranks of an overview took."""
    return _declared(overview.moves)


def _declared(named: Iterable[tuple[str, str, str]]) -> frozenset[Edge]:
    """The declared edges among ``named`` (trigger, source, dest)."""
    taken = set()
    for trigger, source, dest in named:
        try:
            edge = Edge(Trigger(trigger), State(source), State(dest))
        except ValueError:
            continue
        if edge in TRANSITIONS:
            taken.add(edge)
    return frozenset(taken)


def write_diagrams(model: _model.Model, out: Path) -> list[Path]:
    """Write, per attempt of ``model``, ``attempt<N>.mmd``, ``attempt<N>.dot`` (plus ``.svg``, ``.png`` if ``dot``
    exists) and ``attempt<N>-gantt.mermaid``.

    ``N`` is the attempt's number in the timeline (torchrun's restarts numbered on);
    each state diagram highlights the edges any rank took in that attempt (in any of its
    in-process iterations); the gantt chart (``lifecycle._tools.show.gantt``) draws its ranks'
    states and teardown steps on one time axis, the first failure marked. With several
    run ids the names start ``<run id>-``; where jobs shared a run id, then ``job<J>-``
    (1, 2, ...). Returns the paths written.
    A rendering failure is reported on stderr and skipped: the sources are still written.
    """
    out.mkdir(parents=True, exist_ok=True)
    dot_exe = shutil.which("dot")
    written: list[Path] = []
    for drawn in (drawn for run in model.runs for drawn in run.drawn):
        taken = _taken(drawn.overview)
        mmd = out / f"{drawn.stem}.mmd"
        mmd.write_text(_diagrams.mermaid(taken), encoding="utf-8")
        source = mmd.with_suffix(".dot")
        source.write_text(_diagrams.dot(taken), encoding="utf-8")
        chart = out / f"{drawn.stem}-gantt.mermaid"
        chart.write_text(_gantt.gantt(drawn), encoding="utf-8")
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


def _page_timeline(drawn: _model.Drawn) -> list[str]:
    """The page's textual timeline of one attempt: every rank's, up to ``gantt.MAX_ROWS`` ranks; beyond, only the
    ranks the chart draws (the cause's, one of each group), and where to read every rank's."""
    journaled = drawn.overview.journaled
    rows, _ = _model.chart_rows(journaled, drawn.verdict)
    stood = collective_lines(drawn.ranks)
    if len(journaled) <= _gantt.MAX_ROWS:
        return [*stood, *_rank_lines(drawn.ranks, drawn.t0)]
    kept = {row.rank: drawn.ranks[row.rank] for row in rows}
    where = "every rank's: python -m lifecycle show"
    if len(journaled) > _model.TIMELINE_RANKS:  # show groups them too
        where = "any rank's: python -m lifecycle show --ranks R"
    head = f"({len(journaled)} ranks: the {len(kept)} the chart draws; {where})"
    return [head, *stood, *_rank_lines(kept, drawn.t0)]


def write_page(model: _model.Model, path: Path) -> Path:
    """Write the self-contained HTML page of ``model`` to ``path`` (``lifecycle._tools.show.page``); return ``path``.

    Per attempt: its verdict, its timeline and path through the states drawn as SVG
    (``lifecycle._tools.show.svg``), the Mermaid sources folded, and the timeline (timed from
    the attempt's first event, where the printed timeline times from the run's). The
    page loads nothing and runs no script. ``OSError`` if it cannot be written.
    """
    sections = []
    for drawn in (drawn for run in model.runs for drawn in run.drawn):
        taken = _taken(drawn.overview)
        sections.append(
            _page.Section(
                label=drawn.label,
                verdict=drawn.verdict.lines(),
                timeline=_page_timeline(drawn),
                timeline_svg=_svg.timeline(drawn),
                path_svg=_svg.path(drawn),
                gantt=_gantt.gantt(drawn),
                state=_diagrams.mermaid(taken),
            )
        )
    run_ids = ", ".join(model.run_ids)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_page.page(f"lifecycle run {run_ids}", sections), encoding="utf-8")
    return path


def why_not_written(error: OSError, path: Path, *, folder: bool = False) -> str:
    """Why ``path`` (a file, or a ``folder``, to write) could not be written, in words: a part of it that is a file,
    not a folder (where the error says only "File exists" or "Not a directory"), a read-only file system, no
    permission."""
    for part in [path, *path.parents]:
        if part.exists():
            if (part != path or folder) and not part.is_dir():
                return f"{part} is a file, not a folder"
            break
    if error.errno == errno.EROFS:
        return f"{error.filename or path} is on a read-only file system"
    if error.errno in (errno.EACCES, errno.EPERM):
        return f"no permission to write in {error.filename or path}"
    return error.strerror or str(error)


def skipped_text(skipped: Skipped) -> str:
    """What ``show`` says of a problem the reader skipped (a ``journal.Skipped``), after ``warning: ``: the file, the
    line or lines, how many, what (``rank0.jsonl lines 40-52: 13 lines that are not JSON skipped``)."""
    path, n, problem = skipped.path, skipped.count, skipped.problem
    if problem is Problem.NOT_A_JOURNAL:
        why = "binary" if skipped.binary else "no line of it is a journal record"
        return f"{path}: not a journal ({why}) — skipped"
    where = (
        f"{path} line {skipped.first}"
        if skipped.first == skipped.last
        else (f"{path} lines {skipped.first}-{skipped.last}")
    )
    if problem is Problem.UNKNOWN_KIND:
        what = (
            f"a record of unknown kind {skipped.detail!r}"
            if n == 1
            else (f"{n:,} records of unknown kind {skipped.detail!r}")
        )
        return f"{where}: {what} skipped"
    if problem is Problem.NOT_JSON:
        return f"{where}: {'a line that is' if n == 1 else f'{n:,} lines that are'} not JSON skipped"
    if problem is Problem.NUL_BYTES:
        return f"{where}: {n:,} NUL bytes{' at the end' if skipped.at_end else ''} skipped"
    if problem is Problem.BAD_RECORD:
        if n == 1:
            return f"{where}: a record that breaks the schema skipped ({skipped.detail})"
        return f"{where}: {n:,} records that break the schema skipped (the first: {skipped.detail})"
    return f"{path}:{skipped.first}: torn line skipped (its writer was killed mid-write?)"


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


def _rank_list(text: str) -> list[int]:
    """``5,7-9`` as ``[5, 7, 8, 9]``; ``argparse.ArgumentTypeError`` saying what is wrong otherwise."""
    ranks: list[int] = []
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        if not low.isdigit() or not (high.isdigit() or not high) or (high and int(high) < int(low)):
            raise argparse.ArgumentTypeError(f"{text!r} is no list of ranks (e.g. 5,7-9)")
        ranks += range(int(low), int(high or low) + 1)
    return ranks


def parser() -> argparse.ArgumentParser:
    """``show``'s argument parser: its options, declared once (``show --help``, ``python -m lifecycle --help``)."""
    made = argparse.ArgumentParser(
        prog="python -m lifecycle show",
        description=(
            "Print, per attempt, the verdict (which rank failed first, how every rank ended) and the timeline of a run"
            " from its journals; draw the lifecycle path it took and a gantt chart of each attempt."
        ),
    )
    made.add_argument("journals", nargs="+", type=Path, metavar="JOURNAL", help="rank<R>.jsonl files or folders")
    made.add_argument(
        "--out", type=Path, metavar="DIR", help="where to write the diagrams (default: next to the journal)"
    )
    made.add_argument(
        "--ranks",
        type=_rank_list,
        default=[],
        metavar="LIST",
        help=f"past {_model.TIMELINE_RANKS} ranks an attempt, also print these ranks' timelines in full (e.g. 5,7-9)",
    )
    made.add_argument(
        "--html",
        type=Path,
        metavar="PATH",
        help="also write one self-contained HTML page (verdicts, diagrams, timelines) to PATH; it opens offline",
    )
    made.add_argument(
        "--strict",
        action="store_true",
        help="refuse damaged journals: exit 2 at the first line that holds no record (a torn line aside), where show"
        " otherwise skips it with a warning and shows the rest",
    )
    return made


def show_main(argv: list[str]) -> int:
    """``show JOURNAL... [--out DIR] [--ranks LIST] [--html PATH] [--strict]``: print the verdicts and timeline,
    write the diagrams.

    Returns the exit code. Per attempt, the verdict (which rank failed
    first, how the others ended) comes before its ranks' timelines (grouped past 64 ranks,
    see ``render_timeline``; ``--ranks 5,7-9`` adds those ranks' in full). ``--html PATH``
    also writes the self-contained page of ``write_page`` to ``PATH``. The journals are
    read one file at a time (``model.scan``).

    A JOURNAL may be a journal file (read whatever its name) or a folder, which stands
    for its ``rank<R>.jsonl`` files (other ``*.jsonl`` files in it that look like
    journals are noted on stderr and not read), version 2 or 1. A torn line (its
    writer killed mid-write), wherever it is, is skipped and noted on stderr with its
    file and line. A damaged line or file (a record of an unknown kind, a line that is
    not JSON, a record that breaks the schema, NUL bytes, a binary file) is skipped,
    with one warning on stderr per problem of a file (``skipped_text``: file, line or lines,
    count); with ``--strict`` it is refused instead, as before issue 37. Journals of
    different runs, or of jobs that shared a run id, are
    shown as separate runs, with a warning on stderr. Diagrams go to ``--out``
    (default: the folder of the first journal).

    Exit code 0, whatever the verdicts say (a failed run is what ``show`` reports, not
    its own failure), and whatever it skipped while some record was read; 2 when no
    journal holds a readable record (one line: ``no journal records in ...``, with the
    first problem skipped), with ``--strict`` when a journal has a damaged line (``file:line: ...``: not UTF-8, not
    JSON, a record that breaks the schema, ``field 'x' ...``), when a journal cannot be
    read (``OSError``), or when the diagrams or the page cannot be written (the reason said: a part of the path that is
    a file, a read-only folder, no permission; next to the journal, with a hint to give
    ``--out DIR``); 141 (128 + SIGPIPE, what a shell reports for a tool a
    closed pipe stopped) when stdout was closed early (``show ... | head``): the
    rest of the output is dropped quietly and the diagrams are still written.
    """
    args = parser().parse_args(argv)
    for stream in (sys.stdout, sys.stderr):  # a file name that is not UTF-8 must not end the report
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
    try:
        scanned = _model.scan(args.journals, ranks=args.ranks, strict=args.strict)
    except (OSError, ValueError) as exc:
        print(f"cannot read the journal: {exc}", file=sys.stderr)
        return 2
    for note in scanned.ignored:
        print(note, file=sys.stderr)
    for where in scanned.torn:
        print(f"{where}: torn line skipped (its writer was killed mid-write?)", file=sys.stderr)
    if not scanned.records:
        skipped = scanned.skipped
        first = f": {skipped_text(skipped[0])}" if skipped else ""
        more = f" (and {len(skipped) - 1:,} more problems skipped)" if len(skipped) > 1 else ""
        print(f"no journal records in {', '.join(map(str, args.journals))}{first}{more}", file=sys.stderr)
        return 2
    for problem in scanned.skipped:
        print(f"warning: {skipped_text(problem)}", file=sys.stderr)
    model = scanned.model
    for warning in model.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    decided = recorded_decisions(args.journals)
    closed = not print_or_drop("\n".join(render_timeline(model, verdicts=True, ranks=args.ranks, decisions=decided)))
    first = args.journals[0]
    out = args.out if args.out is not None else (first if first.is_dir() else first.parent)
    try:
        written = write_diagrams(model, out)
    except OSError as exc:
        hint = "" if args.out is not None else " (next to the journal); write them elsewhere with --out DIR"
        print(f"cannot write the diagrams to {out}: {why_not_written(exc, out, folder=True)}{hint}", file=sys.stderr)
        return 2
    if args.html is not None:
        try:
            written.append(write_page(model, args.html))
        except OSError as exc:
            print(f"cannot write the page to {args.html}: {why_not_written(exc, args.html)}", file=sys.stderr)
            return 2
    for path in written:
        closed = not print_or_drop(f"wrote {path}") or closed
    return CLOSED_PIPE if closed else 0


if __name__ == "__main__":
    sys.exit(show_main(sys.argv[1:]))
