"""``show`` at scale: 1,024 rank journals of 10 attempts each, against reading the same files with ``json`` alone.

The journals are synthetic (``lifecycle._tools.synthetic.failing_run``): in every
attempt rank 1 fails at step 21 and the 1,023 others fail 60-80 ms later, each
journaling its failure notice and failure teardown; about 310 records (30 KB) per
rank, 80 MB in all. Rounds rotate through three sides, each in every position in turn:

(a) show: ``show_main([folder, "--out", tmp])``, the function ``python -m lifecycle
    show`` runs, in a fresh process of its own (so that its peak resident memory is its
    own: the high-water mark of its resident memory, ``VmHWM`` in ``/proc/self/status``,
    when it returns, and above what the process held once its modules were imported),
    its stdout sent to ``os.devnull`` (no terminal): reading and checking
    every record, the verdict of each attempt, the timeline, the state diagrams and
    gantt charts written (no Graphviz rendering: ``dot`` is not called when absent,
    and is hidden from this run when present).
(b) load: ``lifecycle.journal.load`` alone, the reader (a) starts with: every line
    decoded and checked against the record schema into typed records.
(c) json: each file's lines read and decoded with ``json.loads``, nothing else: the
    floor for anything that reads these files in Python.
(d) html: (a) with ``--html PATH`` as well: the page of all ten attempts, its pictures
    drawn as SVG by ``lifecycle._tools.show.svg``; its size in bytes is reported.

Times are CPU seconds of the process (``time.process_time``): every side is one thread,
and on a shared machine CPU time is what other processes' load disturbs least.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import subprocess
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

BEFORE = {"show": 7.49, "load": 5.34, "json": 1.49, "peak": 218, "grew": 198}
"""This benchmark's numbers on the code before issue 24 (commit a0a446a: the journal reader checking each field by
its annotation's name, show grouping attempts by 6-tuples and computing each verdict up to three times), measured
once on 2026-12-01 on the machine of the table below, back to back with a run of this code; kept to compare with."""


def _json_alone(folder: Path) -> int:
    """Decode every line of every ``rank<R>.jsonl`` in ``folder`` with ``json`` alone; the number of records."""
    count = 0
    for path in sorted(folder.glob("rank*.jsonl")):
        with open(path, "rb") as file:
            for line in file:
                json.loads(line)
                count += 1
    return count


def _peak_kib() -> int:
    """This process's peak resident memory so far, KiB: ``VmHWM`` (``ru_maxrss`` where there is no ``/proc``).

    Not ``ru_maxrss`` on Linux: it keeps the high-water mark of the process that
    started this one (the parent's, through ``fork``/``exec``).
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _show_here(folder: str, out: str, page: str = "") -> None:
    """In this (fresh) process: ``show_main`` on ``folder``, stdout to devnull, no ``dot``; print the measures as JSON.

    Printed: ``seconds`` (show_main alone), ``peak_mb`` (peak resident memory of the
    process) and ``grew_mb`` (that peak less the resident memory after the imports).
    """
    from lifecycle._tools.show.main import show_main

    before = _peak_kib()
    os.environ["PATH"] = ""  # no Graphviz rendering: the same work on machines with and without `dot`
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        start = time.process_time()
        code = show_main([folder, "--out", out, *(["--html", page] if page else [])])
        took = time.process_time() - start
    assert code == 0, f"show exited {code}"
    peak = _peak_kib()
    print(json.dumps({"seconds": took, "peak_mb": peak / 1024, "grew_mb": (peak - before) / 1024}))


def _show(folder: Path, out: Path, memory: list[tuple[float, float]], page: Path | None = None) -> float:
    """``_show_here`` in a fresh interpreter; seconds (its peak and growth in MB appended to ``memory``); with
    ``page``, ``--html page`` too."""
    done = subprocess.run(
        [sys.executable, __file__, "--show-here", str(folder), str(out), *([str(page)] if page else [])],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    memory.append((measured["peak_mb"], measured["grew_mb"]))
    return float(measured["seconds"])


def _timed(fn: Callable[[], object]) -> float:
    """Seconds ``fn()`` took."""
    start = time.process_time()
    fn()
    return time.process_time() - start


def main() -> str:
    """Write the journals, time the three sides over ``ROUNDS`` rotating rounds; the Markdown table."""
    from lifecycle import journal
    from lifecycle._tools.show import synthetic

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "journals"
        synthetic.write(folder, synthetic.failing_run("bench", RANKS, ATTEMPTS))
        size = sum(p.stat().st_size for p in folder.iterdir()) / 1e6
        records = _json_alone(folder)
        sides: dict[str, list[float]] = {"show": [], "load": [], "json": [], "html": []}
        memory: list[tuple[float, float]] = []
        page = Path(tmp) / "page.html"
        run = {
            "show": lambda: _show(folder, Path(tmp) / "diagrams", memory),
            "load": lambda: _timed(lambda: journal.load([folder])),
            "json": lambda: _timed(lambda: _json_alone(folder)),
            "html": lambda: _show(folder, Path(tmp) / "diagrams", [], page),
        }
        order = list(run)
        for round_ in range(ROUNDS):
            for name in order[round_ % 4 :] + order[: round_ % 4]:
                sides[name].append(run[name]())
        page_kb = page.stat().st_size / 1000
    show, load, raw, html = (median(sides[name]) for name in ("show", "load", "json", "html"))
    peak, grew = (median([m[i] for m in memory]) for i in (0, 1))
    text = table(
        f"show over {RANKS} rank journals × {ATTEMPTS} attempts ({records} records, {size:.0f} MB;"
        f" median of {ROUNDS} rotating rounds; CPU s)",
        [
            "code",
            "(a) show, whole command",
            "(b) journal.load alone",
            "(c) json alone",
            "(a)/(c)",
            "(b)/(c)",
            "(a) peak RSS (MB)",
            "(a) peak RSS over its imports (MB)",
        ],
        [
            [
                "before issue 24 (a0a446a, measured once)",
                *(f"{BEFORE[side]:.2f}" for side in ("show", "load", "json")),
                f"{BEFORE['show'] / BEFORE['json']:.1f}",
                f"{BEFORE['load'] / BEFORE['json']:.1f}",
                f"{BEFORE['peak']:.0f}",
                f"{BEFORE['grew']:.0f}",
            ],
            [
                "this code",
                f"{show:.2f}",
                f"{load:.2f}",
                f"{raw:.2f}",
                f"{show / raw:.1f}",
                f"{load / raw:.1f}",
                f"{peak:.0f}",
                f"{grew:.0f}",
            ],
        ],
    )
    return (
        text + "\nWhat this shows: whether `python -m lifecycle show` stays interactive on a large job's journals "
        "(1,024 ranks, 10 attempts, every rank failing in every attempt: the most the verdict and the charts have "
        "to say). (a)/(c) is what show costs over merely decoding the same lines; (b)/(c) is the part of it spent "
        "reading records into checked, typed values (the journal reader validates every field of every record; the "
        "target is at most 2), and the rest, (a) − (b), is the verdicts, the timeline and the diagrams of all ten "
        "attempts. Peak memory is show's own process: its high-water mark, and that less what it held once imported "
        "(since issue 29 show reads one journal at a time and keeps a summary of each rank, not its records: the "
        "section show at scale has 16,384 ranks). "
        "The first row is the code before issue 24, kept from one run of this script (read the ratios: CPU seconds "
        "drift less than wall time on a shared machine, but they drift).\n"
        f"\n`show --html` on the same journals (d): {html:.2f} CPU s for the whole command, {html - show:+.2f} s over"
        f" (a); the page of all {ATTEMPTS} attempts is {page_kb:.0f} kB (each attempt's timeline drawn as SVG with at"
        " most 16 rows: the cause's rank and one row per group of ranks that ended alike; no script).\n"
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--show-here"]:
        _show_here(*sys.argv[2:5])
    else:
        print(main())
