"""The demo's launcher owns its children: a signal stops them all, gracefully once, at once twice; none outlives it.

Each demo runs in its own session (as from a terminal, but only the launcher is sent
the signal), marked so that every process it started can be found afterwards. The
old launcher ignored them: SIGTERM killed the launcher alone (torchrun, re-parented,
trained on with no report), a second SIGINT ended in a traceback without a timeline,
and a SIGKILLed launcher left torchrun and the ranks running.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest
from support.internals import final_states
from support.launch import started_demo

from lifecycle import ExitCode
from lifecycle.journal import RunEnd, read

TRAINING = "tokens/s"
"""Rank 0's progress line: training has started on every rank."""

ENDLESS = ["--steps=1000000", "--log-interval=20", "--eval-interval=0", "--checkpoint-interval=0"]
"""A run that trains until stopped (the final checkpoint is still saved)."""


def ends(journal: Path) -> dict[int, RunEnd]:
    """Each rank's last end record."""
    return {r.origin.rank: r for r in read([journal]) if isinstance(r, RunEnd)}


@pytest.mark.timeout(120)
def test_sigterm_stops_every_rank_after_the_same_step_saved_and_closed(tmp_path: Path) -> None:
    """SIGTERM to the launcher: each rank takes the requested exit and closes; timeline printed; exit 75 (stopped)."""
    journal = tmp_path / "journal"
    with started_demo(*ENDLESS, f"--journal-dir={journal}", cwd=tmp_path) as demo:
        demo.wait_for(TRAINING, timeout=90)
        demo.signal(signal.SIGTERM)
        done = demo.finish(timeout=60)
        assert demo.left_running() == [], done.stdout[-3000:]
    assert done.returncode == ExitCode.STOPPED, done.stdout[-3000:]
    assert "=== timeline" in done.stdout and "finalizing → closed" in done.stdout
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("demo: stopped on SIGTERM") and "every rank saved and closed" in last, last
    end = ends(journal)
    assert {rank: e.state for rank, e in end.items()} == {0: "closed", 1: "closed"}
    assert {e.exit_reason for e in end.values()} == {"requested"}
    assert end[0].final_step == end[1].final_step == end[0].checkpoint_step, end


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_second_sigint_kills_everything_at_once_without_a_traceback(tmp_path: Path) -> None:
    """Ctrl-C twice: all stops at once, no traceback, the timeline of what the journals hold; exit 75 iff closed."""
    journal = tmp_path / "journal"
    with started_demo(*ENDLESS, f"--journal-dir={journal}", cwd=tmp_path) as demo:
        demo.wait_for(TRAINING, timeout=90)
        demo.signal(signal.SIGINT)
        demo.wait_for("again to kill them now", timeout=10)
        demo.signal(signal.SIGINT)
        started = time.monotonic()
        done = demo.finish(timeout=30)
        assert time.monotonic() - started < 10, done.stdout[-3000:]
        assert demo.left_running() == [], done.stdout[-3000:]
    assert "Traceback" not in done.stdout and "KeyboardInterrupt" not in done.stdout, done.stdout[-3000:]
    assert "=== timeline" in done.stdout
    states = final_states(read([journal]))
    closed = set(states.values()) == {"closed"} and len(states) == 2
    # Almost always the kill comes before the ranks close; the verdict follows the journals either way.
    assert done.returncode == (ExitCode.STOPPED if closed else ExitCode.RESTART), (states, done.stdout[-3000:])
    last = done.stdout.strip().splitlines()[-1]
    assert closed or (last.startswith("demo: FAILED") and "SIGINT again" in last), last


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_sigkilled_launcher_takes_torchrun_and_the_ranks_with_it(tmp_path: Path) -> None:
    """SIGKILL to the launcher: torchrun (parent-death SIGTERM) stops its ranks, and all are gone within seconds."""
    journal = tmp_path / "journal"
    with started_demo(*ENDLESS, f"--journal-dir={journal}", cwd=tmp_path) as demo:
        demo.wait_for(TRAINING, timeout=90)
        assert len(demo.left_running()) >= 4  # launcher, torchrun, two ranks
        demo.signal(signal.SIGKILL)
        demo.process.wait(10)
        left = demo.left_running(within=20)
        assert left == [], (left, demo.output[-3000:])
    # torchrun forwarded its SIGTERM: the ranks took the requested exit.
    assert {rank: e.state for rank, e in ends(journal).items()} == {0: "closed", 1: "closed"}


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
