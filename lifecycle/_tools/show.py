"""``python -m lifecycle show JOURNAL...``: a run's timeline, and the diagram of the path it took.

The timeline lists, per attempt and per rank, every transition and teardown step with
its time relative to the start of the run. The attempts of a run are ordered by
torchrun's restart count, then by ``pretrain``'s attempt number: the workers torchrun
restarts count their attempts from 0 again, and show numbers them on from the
attempts before (``attempt 2 (torchrun restart 1)``). The diagrams are the lifecycle diagrams of
``lifecycle._tools.diagrams`` (generated from ``TRANSITIONS``) with the edges the run took
highlighted: one Mermaid and one Graphviz file per attempt, rendered to SVG and PNG
when Graphviz's ``dot`` is installed.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from lifecycle._core import journal as _journal
from lifecycle._core.journal import Eval, Left, Record, RunEnd, RunStart, Step, TeardownStep, Transition
from lifecycle._core.states import State, Trigger
from lifecycle._core.table import TRANSITIONS, Edge
from lifecycle._tools import diagrams as _diagrams

Attempt = tuple[str, int, int, str, int]
"""An attempt's identity: run id, torchrun restart count, attempt number, restart mode, iteration."""


def _short(text: str, limit: int = 160) -> str:
    """The first line of ``text``, cut to ``limit`` characters (gloo's errors run long)."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


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
            events.append((r.start, f"    {verb} {r.step:<32} {_ms(r.end - r.start)}{failed}{note}"))
    steps = [r for r in call if isinstance(r, Step)]
    last = steps[-1] if steps else None
    if last is not None and last.end is not None:
        events.append((last.end, f"step {last.step} ended (the last recorded; loss {last.loss:.3f})"))
    return sorted(events, key=lambda event: event[0])


def _summary(call: list[Record]) -> str:
    """One line on how a call ended, its losses and checkpoint; a call without an end record was cut short."""
    ends = [r for r in call if isinstance(r, RunEnd)]
    steps = [r for r in call if isinstance(r, Step)]
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


def _by_attempt(records: Iterable[Record]) -> dict[Attempt, dict[int, list[Record]]]:
    """Records grouped by attempt, then by rank.

    Runs come in order of first appearance; a run's attempts by (torchrun restart
    count, attempt number), then in order of first appearance (in-process iterations).
    """
    grouped: dict[Attempt, dict[int, list[Record]]] = {}
    for r in records:
        o = r.origin
        key = (o.run_id, o.restart_count, o.attempt, o.restart_mode, o.iteration)
        grouped.setdefault(key, {}).setdefault(o.rank, []).append(r)
    runs = list(dict.fromkeys(run_id for run_id, *_ in grouped))
    order = sorted(grouped, key=lambda key: (runs.index(key[0]), key[1], key[2]))  # stable: iterations keep order
    return {key: dict(sorted(grouped[key].items())) for key in order}


def _numbers(attempts: Iterable[Attempt]) -> dict[Attempt, int]:
    """The number show gives each attempt: its own until torchrun restarts, then one more than the run's last.

    Within a run, in the order given (``_by_attempt``'s): ``max(attempt, previous + 1)``
    per distinct (restart count, attempt), so a run that torchrun never restarted keeps
    its attempt numbers, and a restarted worker's attempt 0 follows the attempts before.
    """
    numbers: dict[Attempt, int] = {}
    last: dict[str, tuple[tuple[int, int], int]] = {}  # per run: the last (restart count, attempt) and its number
    for key in attempts:
        run_id, restarts, attempt = key[:3]
        seen = last.get(run_id)
        if seen is not None and seen[0] == (restarts, attempt):
            number = seen[1]
        else:
            number = attempt if seen is None else max(attempt, seen[1] + 1)
        last[run_id] = ((restarts, attempt), number)
        numbers[key] = number
    return numbers


def _label(key: Attempt, number: int, restarted: bool) -> str:
    """``attempt N``, noting the torchrun restart (in a ``restarted`` run), the call's own number, the restart mode."""
    _, restarts, attempt, mode, iteration = key
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


def timeline_lines(records: list[Record]) -> list[str]:
    """The timeline: per run id, per attempt, per rank, every event with its time since the run's first event.

    Each rank's line says how its call ended, or, without an end record (a killed or
    hung rank), the state it reached and the last training step it recorded.
    """
    if not records:
        return ["(no journal records)"]
    lines: list[str] = []
    run_id = None
    t0 = 0.0
    grouped = _by_attempt(records)
    numbers = _numbers(grouped)
    restarted = {key[0] for key in grouped if key[1] > 0}
    for key, ranks in grouped.items():
        rid = key[0]
        if rid != run_id:
            run_id = rid
            starts = [t for r in records if r.origin.run_id == rid for t, _ in _events([r])]
            t0 = min(starts, default=0.0)
            lines.append(f"run {rid}")
        lines.append(_label(key, numbers[key], rid in restarted))
        for rank, rank_records in ranks.items():
            for call in _split_calls(rank_records):
                lines.append(f"  rank {rank}: {_summary(call)}")
                lines += [f"  {t - t0:+9.3f}s  {text}" for t, text in _events(call)]
                lines += [
                    f"  {'':11}      left alone: {r.resource}: {r.reason}"
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
    taken = set()
    for record in records:
        if not isinstance(record, Transition):
            continue
        try:
            edge = Edge(Trigger(record.trigger), State(record.source), State(record.dest))
        except ValueError:
            continue
        if edge in TRANSITIONS:
            taken.add(edge)
    return frozenset(taken)


def write_diagrams(records: list[Record], out: Path) -> list[Path]:
    """Write, per attempt, ``attempt<N>.mmd`` and ``attempt<N>.dot`` (plus ``.svg``, ``.png`` if ``dot`` exists).

    ``N`` is the attempt's number in the timeline (torchrun's restarts numbered on);
    each diagram highlights the edges any rank took in that attempt (in any of its
    in-process iterations). With several run ids the names start ``<run id>-``.
    Returns the paths written.
    A rendering failure is reported on stderr and skipped: the sources are still written.
    """
    out.mkdir(parents=True, exist_ok=True)
    dot_exe = shutil.which("dot")
    written: list[Path] = []
    grouped = _by_attempt(records)
    numbers = _numbers(grouped)
    attempts: dict[tuple[str, int], list[Record]] = {}
    for key, ranks in grouped.items():
        attempts.setdefault((key[0], numbers[key]), []).extend(
            r for rank_records in ranks.values() for r in rank_records
        )
    several = len({run_id for run_id, _ in attempts}) > 1
    for (run_id, number), attempt_records in attempts.items():
        taken = taken_edges(attempt_records)
        prefix = re.sub(r"[^A-Za-z0-9._-]", "_", run_id) + "-" if several else ""
        mmd = out / f"{prefix}attempt{number}.mmd"
        mmd.write_text(_diagrams.mermaid(taken), encoding="utf-8")
        source = mmd.with_suffix(".dot")
        source.write_text(_diagrams.dot(taken), encoding="utf-8")
        written += [mmd, source]
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


def show_main(argv: list[str]) -> int:
    """``show JOURNAL... [--out DIR]``: print the timeline, write the diagrams; return the exit code.

    A JOURNAL may be a ``rank<R>.jsonl`` file or a folder of them, version 2 or 1. A
    torn line (its writer killed mid-write) is skipped and noted on stderr. Diagrams go
    to ``--out`` (default: the folder of the first journal). Exit code 0, or 2 when a
    journal cannot be read or holds no record.
    """
    parser = argparse.ArgumentParser(
        prog="python -m lifecycle show",
        description="Print the timeline of a run from its journals and draw the lifecycle path it took.",
    )
    parser.add_argument("journals", nargs="+", type=Path, metavar="JOURNAL", help="rank<R>.jsonl files or folders")
    parser.add_argument("--out", type=Path, help="where to write the diagrams (default: next to the journal)")
    args = parser.parse_args(argv)
    try:
        loaded = _journal.load(args.journals)
    except (OSError, ValueError) as exc:
        print(f"cannot read the journal: {exc}", file=sys.stderr)
        return 2
    for where in loaded.torn:
        print(f"{where}: torn line skipped (its writer was killed mid-write?)", file=sys.stderr)
    records = list(loaded.records)
    if not records:
        print(f"no journal records in {', '.join(map(str, args.journals))}", file=sys.stderr)
        return 2
    print("\n".join(timeline_lines(records)))
    first = args.journals[0]
    out = args.out if args.out is not None else (first if first.is_dir() else first.parent)
    for path in write_diagrams(records, out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(show_main(sys.argv[1:]))
