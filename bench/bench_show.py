"""``show`` at scale: 1,024 rank journals of 10 attempts each, against reading the same files with ``json`` alone.

The journals are synthetic (``lifecycle._tools.synthetic.failing_run``): in every
attempt rank 1 fails at step 21 and the 1,023 others fail 60-80 ms later, each
journaling its failure notice and failure teardown; about 310 records (30 KB) per
rank, 80 MB in all. Rounds rotate through three sides, each in every position in turn:

(a) show: ``show_main([folder, "--out", tmp])``, the function ``python -m lifecycle
    show`` runs, its stdout sent to ``os.devnull`` (no terminal): reading and checking
    every record, the verdict of each attempt, the timeline, the state diagrams and
    gantt charts written (no Graphviz rendering: ``dot`` is not called when absent,
    and is hidden from this run when present).
(b) load: ``lifecycle._core.journal.load`` alone, the reader (a) starts with: every line
    decoded and checked against the record schema into typed records.
(c) json: each file's lines read and decoded with ``json.loads``, nothing else: the
    floor for anything that reads these files in Python.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import median, table

RANKS = 1024
ATTEMPTS = 10
ROUNDS = 3


def _json_alone(folder: Path) -> int:
    """Decode every line of every ``rank<R>.jsonl`` in ``folder`` with ``json`` alone; the number of records."""
    count = 0
    for path in sorted(folder.glob("rank*.jsonl")):
        with open(path, "rb") as file:
            for line in file:
                json.loads(line)
                count += 1
    return count


def _show(folder: Path, out: Path) -> float:
    """``show_main`` on ``folder`` with stdout to devnull and no ``dot``; seconds."""
    from lifecycle._tools.show import show_main

    path = os.environ.get("PATH", "")
    os.environ["PATH"] = ""  # no Graphviz rendering: the same work on machines with and without `dot`
    try:
        with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
            start = time.perf_counter()
            code = show_main([str(folder), "--out", str(out)])
            took = time.perf_counter() - start
    finally:
        os.environ["PATH"] = path
    assert code == 0, f"show exited {code}"
    return took


def _timed(fn: Callable[[], object]) -> float:
    """Seconds ``fn()`` took."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> str:
    """Write the journals, time the three sides over ``ROUNDS`` rotating rounds; the Markdown table."""
    from lifecycle._core import journal
    from lifecycle._tools import synthetic

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "journals"
        synthetic.write(folder, synthetic.failing_run("bench", RANKS, ATTEMPTS))
        size = sum(p.stat().st_size for p in folder.iterdir()) / 1e6
        records = _json_alone(folder)
        sides: dict[str, list[float]] = {"show": [], "load": [], "json": []}
        run = {
            "show": lambda: _show(folder, Path(tmp) / "diagrams"),
            "load": lambda: _timed(lambda: journal.load([folder])),
            "json": lambda: _timed(lambda: _json_alone(folder)),
        }
        order = list(run)
        for round_ in range(ROUNDS):
            for name in order[round_ % 3 :] + order[: round_ % 3]:
                sides[name].append(run[name]())
    show, load, raw = (median(sides[name]) for name in ("show", "load", "json"))
    text = table(
        f"show over {RANKS} rank journals × {ATTEMPTS} attempts ({records} records, {size:.0f} MB;"
        f" median of {ROUNDS} rotating rounds; s)",
        ["(a) show, whole command", "(b) journal.load alone", "(c) json alone", "(a)/(c)", "(b)/(c)", "target (a)"],
        [[f"{show:.2f}", f"{load:.2f}", f"{raw:.2f}", f"{show / raw:.1f}", f"{load / raw:.1f}", "a few seconds"]],
    )
    return (
        text + "\nWhat this shows: whether `python -m lifecycle show` stays interactive on a large job's journals "
        "(1,024 ranks, 10 attempts, every rank failing in every attempt: the most the verdict and the charts have "
        "to say). (a)/(c) is what show costs over merely decoding the same lines; (b)/(c) is the part of it spent "
        "reading records into checked, typed values (the journal reader validates every field of every record), "
        "and the rest, (a) − (b), is the verdicts, the timeline and the diagrams of all ten attempts.\n"
    )


if __name__ == "__main__":
    print(main())
