"""``show`` on many ranks (issue 29, item 4): one journal file open at a time, the records of the shown ranks only,
the text timeline grouped past 64 ranks an attempt, the same verdicts and pictures as from every record.

Before issue 29's streaming ``show`` read every record into memory and printed every rank's timeline (about 30
lines a rank and attempt); the grouping and the model checks here fail on it. The 16,384-rank size is measured by
``bench/show_scale.py`` (docs/benchmarks.md), not here.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lifecycle import journal
from lifecycle._tools.show import gantt, svg, synthetic
from lifecycle._tools.show import model as show_model
from lifecycle._tools.show.main import render_timeline
from lifecycle.journal import Record

WORLD = 300
OPEN_FILES = 24
"""The open-files limit the command runs under: the standard streams, Python's imports (one at a time), and room for
a few more, far below the 300 journals it reads."""

_RUN = textwrap.dedent(
    """
    import resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    if sys.argv[1] == "show":
        from lifecycle._tools.show.main import show_main
        sys.exit(show_main(sys.argv[2:]))
    from pathlib import Path
    held = [open(p, "rb") for p in sorted(Path(sys.argv[2]).glob("rank*.jsonl"))]  # every journal at once
    """
)


def run_limited(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """This interpreter under a soft limit of ``OPEN_FILES`` open files: ``show ARGS...``, or ``hold FOLDER`` (open
    every journal of the folder at once, as a reader that merges them would)."""
    return subprocess.run(
        [sys.executable, "-c", _RUN.format(limit=OPEN_FILES), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def journals(folder: Path) -> dict[int, list[Record]]:
    """Write 300 ranks' journals of 2 attempts into ``folder`` (rank 1 fails first; rank 7 killed in the second
    attempt; rank 299 never journaled); return them."""
    ranks = synthetic.failing_run("r", WORLD, 2)
    ranks[7] = ranks[7][:-9]
    del ranks[WORLD - 1]
    synthetic.write(folder, ranks)
    return ranks


@pytest.mark.timeout(180)
def test_show_reads_300_ranks_under_a_small_open_files_limit_and_groups_the_timeline(tmp_path: Path) -> None:
    """300 ranks' journals under a limit of 24 open files (which opening them all at once exceeds): ``show`` exits 0
    and prints, per attempt, the cause's timeline and one per group of ranks that ended alike, not 300 ranks', and
    those of the ranks asked for (``--ranks``)."""
    journals(tmp_path / "j")
    held = run_limited("hold", tmp_path / "j")
    assert held.returncode != 0 and "Too many open files" in held.stderr  # the limit bites a reader that holds them
    done = run_limited("show", tmp_path / "j", "--out", tmp_path / "d", "--ranks", "5,298")
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert len(out) < 120, len(out)  # every rank's timeline: about 9,000 lines
    assert "  (299 ranks: one timeline for each group that ended alike, the cause's first)" in out
    second = out[out.index("attempt 1") :]
    assert second[second.index("  ranks 0, 2-6, 8-298 (297 ranks), as rank 0:") + 1].startswith("  rank 0: ended")
    assert any(line.startswith("  rank 7: no end record (killed?)") for line in second)
    assert not any(line.startswith("  rank 2:") for line in out)  # a rank of a group is not shown on its own
    assert out.count("  rank 5, as asked:") == 2 and out.count("  rank 298, as asked:") == 2  # once an attempt
    assert {p.name for p in (tmp_path / "d").iterdir()} >= {"attempt0-gantt.mermaid", "attempt1.mmd"}


def test_scan_keeps_the_shown_ranks_records_and_tells_what_build_tells(tmp_path: Path) -> None:
    """``show_model.scan`` of 300 ranks keeps the records of at most 16 + 4 ranks an attempt, yet gives the same
    verdicts, gantt charts, SVG pictures and timeline as ``build`` of every record; at 40 ranks it keeps every
    rank's records, and the timeline lists each."""
    ranks = journals(tmp_path / "j")
    scanned = show_model.scan([tmp_path / "j"])
    built = show_model.build([r for rs in ranks.values() for r in rs])
    assert scanned.records == sum(map(len, ranks.values())) and scanned.torn == ()
    for run_scanned, run_built in zip(scanned.model.runs, built.runs, strict=True):
        for a, b in zip(run_scanned.attempts, run_built.attempts, strict=True):
            assert len(a.overview.journaled) == WORLD - 1 and len(a.ranks) <= gantt.MAX_ROWS + 4, sorted(a.ranks)
            assert a.verdict.lines() == b.verdict.lines() and a.overview == b.overview
        for a, b in zip(run_scanned.drawn, run_built.drawn, strict=True):
            assert gantt.gantt(a) == gantt.gantt(b)
            assert svg.timeline(a) == svg.timeline(b) and svg.path(a) == svg.path(b)
    assert render_timeline(scanned.model, verdicts=True) == render_timeline(built, verdicts=True)
    small = synthetic.failing_run("s", 40, 1)
    synthetic.write(tmp_path / "s", small)
    model = show_model.scan([tmp_path / "s"]).model
    (attempt,) = model.runs[0].attempts
    assert sorted(attempt.ranks) == list(range(40))
    lines = render_timeline(model)
    assert [line for line in lines if line.startswith("  rank ")] == [
        line for line in render_timeline(show_model.build(journal.read([tmp_path / "s"]))) if line.startswith("  rank ")
    ]
    assert sum(line.startswith("  rank ") for line in lines) == 40


def test_scan_holds_a_few_steps_of_a_long_call_and_tells_what_build_tells(tmp_path: Path) -> None:
    """A rank's call of 5,000 steps (an evaluation every 100) and a peer's that failed: ``scan`` holds at most four
    step and evaluation records of each rank's stretch (first and last step, the latest, the last evaluation: one line
    of a long journal's memory, not one a step), and prints and draws what ``build`` of every record does (issue 37;
    before, it held all 5,000)."""
    ranks: dict[int, list[Record]] = {0: [], 1: []}
    for rank, records in ranks.items():
        o = journal.Origin("long", rank, 0, "ordinary", 0)
        call = synthetic.rank_call(o, 2, 100.0, steps=5_000 - 1_000 * rank, end="closed" if rank == 0 else "failed")
        for r in call:
            records.append(r)
            if isinstance(r, journal.TrainStep) and r.step % 100 == 0:
                records.append(journal.Eval(origin=o, step=r.step, loss=r.loss / 2, start=r.start, end=r.start))
    synthetic.write(tmp_path / "j", ranks)
    scanned = show_model.scan([tmp_path / "j"])
    built = show_model.build(journal.read([tmp_path / "j"]))
    assert scanned.records == sum(map(len, ranks.values()))
    (attempt,) = scanned.model.runs[0].attempts
    for rank_records in attempt.ranks.values():
        assert sum(isinstance(r, journal.TrainStep | journal.Eval) for r in rank_records) <= 4
    assert render_timeline(scanned.model, verdicts=True) == render_timeline(built, verdicts=True)
    (a,), (b,) = scanned.model.runs[0].drawn, built.runs[0].drawn
    assert gantt.gantt(a) == gantt.gantt(b) and svg.timeline(a) == svg.timeline(b) and svg.path(a) == svg.path(b)
