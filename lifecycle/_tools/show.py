"""``python -m lifecycle show JOURNAL...``: a run's timeline, and the diagram of the path it took.

The timeline lists, per attempt and per rank, every transition and teardown step with
its time relative to the start of the run. The diagrams are the lifecycle diagrams of
``lifecycle._tools.diagrams`` (generated from ``TRANSITIONS``) with the edges the run took
highlighted: one Mermaid and one Graphviz file per attempt, rendered to SVG and PNG
when Graphviz's ``dot`` is installed.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from lifecycle._core import journal as _journal
from lifecycle._core.journal import Record
from lifecycle._core.states import State, Trigger
from lifecycle._core.table import TRANSITIONS, Edge
from lifecycle._tools import diagrams as _diagrams


def _time(record: Record) -> float:
    """When a record's event started (wall-clock seconds)."""
    if record["kind"] == "run":
        return float(record["start"])
    if record["kind"] == "transition":
        # ``at`` is when the state changed; the trigger's work (teardown included) came before.
        return float(record["at"]) - float(record["duration_s"])
    return float(record.get("at", 0.0))


def _short(text: str, limit: int = 160) -> str:
    """The first line of ``text``, cut to ``limit`` characters (gloo's errors run long)."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _event_line(record: Record, t0: float) -> str | None:
    at = f"{_time(record) - t0:+9.3f}s"
    kind = record["kind"]
    if kind == "run":
        return (
            f"{at}  pretrain started (pid {record['pid']} on {record['host']}, "
            f"restart mode {record['restart_mode']}, iteration {record['iteration']})"
        )
    if kind == "transition":
        line = f"{at}  {record['source']} → {record['dest']}  [{record['trigger']}, {_ms(record['duration_s'])}]"
        detail = record.get("detail") or ""
        return line + (f"  {_short(detail)}" if detail and record["dest"] == State.FAILED.value else "")
    if kind == "teardown":
        failed = f"  FAILED: {_short(record['error'])}" if record.get("error") else ""
        return f"{at}      teardown {record['step']:<32} {_ms(record['duration_s'])}{failed}"
    if kind == "left":
        return f"{'':11}      left alone: {record['resource']}: {record['reason']}"
    return None


def _summary(end: Record) -> str:
    state = end.get("state", "?")
    if end.get("error"):
        head = f"ended {state} after step {end.get('final_step')}: {_short(end['error'])}"
    else:
        head = f"ended {state} after step {end.get('final_step')} (exit: {end.get('exit_reason')})"
    losses = end.get("losses") or []
    if losses:
        (first_step, first), (last_step, last) = losses[0], losses[-1]
        head += f"; loss {first:.3f} (step {first_step}) → {last:.3f} (step {last_step})"
    evals = end.get("eval_losses") or []
    if evals:
        head += f"; eval loss {evals[-1][1]:.3f}"
    if end.get("checkpoint_step") is not None:
        head += f"; checkpoint step {end['checkpoint_step']}"
    return head


def _by_attempt(records: Iterable[Record]) -> dict[int, dict[int, list[Record]]]:
    grouped: dict[int, dict[int, list[Record]]] = {}
    for record in records:
        grouped.setdefault(int(record["attempt"]), {}).setdefault(int(record["rank"]), []).append(record)
    return {a: dict(sorted(ranks.items())) for a, ranks in sorted(grouped.items())}


def _split_calls(records: list[Record]) -> list[list[Record]]:
    """One rank's records of one attempt, split into ``pretrain`` calls (each starts with a ``run`` record)."""
    calls: list[list[Record]] = []
    for record in records:
        if record["kind"] == "run" or not calls:
            calls.append([])
        calls[-1].append(record)
    return calls


def timeline_lines(records: list[Record]) -> list[str]:
    """The timeline of a run: per attempt, per rank, every event with its time since the run's first event."""
    if not records:
        return ["(no journal records)"]
    t0 = min(_time(r) for r in records if r["kind"] in ("run", "transition"))
    lines: list[str] = []
    for attempt, ranks in _by_attempt(records).items():
        lines.append(f"attempt {attempt}")
        for rank, rank_records in ranks.items():
            for call in _split_calls(rank_records):
                ends = [r for r in call if r["kind"] == "end"]
                lines.append(f"  rank {rank}: " + (_summary(ends[-1]) if ends else "no end record (the process died?)"))
                timed = sorted((r for r in call if r["kind"] != "left"), key=_time)
                lines += [f"  {line}" for r in timed if (line := _event_line(r, t0)) is not None]
                lines += [f"  {line}" for r in call if r["kind"] == "left" and (line := _event_line(r, t0))]
    return lines


def final_states(records: list[Record]) -> dict[int, str]:
    """Each rank's state at the end of its last attempt (``closed``, ``failed``, or ``?`` without an end record)."""
    last: dict[int, int] = {}
    for record in records:
        rank = int(record["rank"])
        last[rank] = max(last.get(rank, -1), int(record["attempt"]))
    states = dict.fromkeys(last, "?")
    for record in records:
        if record["kind"] == "end" and int(record["attempt"]) == last[int(record["rank"])]:
            states[int(record["rank"])] = str(record["state"])
    return dict(sorted(states.items()))


def taken_edges(records: Iterable[Record]) -> frozenset[Edge]:
    """The declared edges the transition records took (a record naming no declared edge is ignored)."""
    taken = set()
    for record in records:
        if record["kind"] != "transition":
            continue
        try:
            edge = Edge(Trigger(record["trigger"]), State(record["source"]), State(record["dest"]))
        except ValueError:
            continue
        if edge in TRANSITIONS:
            taken.add(edge)
    return frozenset(taken)


def write_diagrams(records: list[Record], out: Path) -> list[Path]:
    """Write, per attempt, ``attempt<N>.mmd`` and ``attempt<N>.dot`` (plus ``.svg``, ``.png`` if ``dot`` exists).

    Each highlights the edges any rank took in that attempt. Returns the paths written.
    A rendering failure is reported on stderr and skipped: the sources are still written.
    """
    out.mkdir(parents=True, exist_ok=True)
    dot_exe = shutil.which("dot")
    written: list[Path] = []
    for attempt, ranks in _by_attempt(records).items():
        taken = taken_edges(r for rank_records in ranks.values() for r in rank_records)
        mmd = out / f"attempt{attempt}.mmd"
        mmd.write_text(_diagrams.mermaid(taken), encoding="utf-8")
        source = out / f"attempt{attempt}.dot"
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

    A JOURNAL may be a ``rank<R>.jsonl`` file or a folder of them. Diagrams go to
    ``--out`` (default: the folder of the first journal). Exit code 0, or 2 when a
    journal cannot be read.
    """
    parser = argparse.ArgumentParser(
        prog="python -m lifecycle show",
        description="Print the timeline of a run from its journals and draw the lifecycle path it took.",
    )
    parser.add_argument("journals", nargs="+", type=Path, metavar="JOURNAL", help="rank<R>.jsonl files or folders")
    parser.add_argument("--out", type=Path, help="where to write the diagrams (default: next to the journal)")
    args = parser.parse_args(argv)
    try:
        records = _journal.read(args.journals)
    except (OSError, ValueError) as exc:
        print(f"cannot read the journal: {exc}", file=sys.stderr)
        return 2
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
