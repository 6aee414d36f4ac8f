"""The demo's launcher owns its children: a signal stops them all, gracefully once, at once twice; none outlives it.

Each demo runs in its own session (as from a terminal, but only the launcher is sent
the signal), marked so that every process it started can be found afterwards. The
old launcher ignored them: SIGTERM killed the launcher alone (torchrun, re-parented,
trained on with no report), a second SIGINT ended in a traceback without a timeline,
and a SIGKILLed launcher left torchrun and the ranks running.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest
from support.internals import final_states
from support.launch import started_demo

from lifecycle import ExitCode
from lifecycle._tools.demo.main import _Signals
from lifecycle._tools.demo.options import SAME_REQUEST_S, parser
from lifecycle.journal import RunEnd, read

TRAINING = "tokens/s"
"""Rank 0's progress line: training has started on every rank."""

ENDLESS = ["--steps=1000000", "--log-interval=20", "--eval-interval=0", "--checkpoint-interval=0"]
"""A run that trains until stopped (the final checkpoint is still saved)."""


def ends(journal: Path) -> dict[int, RunEnd]:
    """Each rank's last end record."""
    return {r.origin.rank: r for r in read([journal]) if isinstance(r, RunEnd)}


@pytest.mark.slow  # 7 s; test_pretrain's SIGTERM on one of two ranks keeps the stop at one step in make test
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


def test_signals_within_the_window_are_one_request_and_a_later_one_is_a_second() -> None:
    """A forwarded copy of a Ctrl-C (within ``SAME_REQUEST_S``) is the first request; one after the window escalates."""
    now = [100.0]
    signals = _Signals(clock=lambda: now[0])
    signals._record(signal.SIGINT, None)
    now[0] += 0.001  # timeout's copy to the child, then its copy to the group
    signals._record(signal.SIGINT, None)
    signals._record(signal.SIGTERM, None)
    now[0] = 100.0 + SAME_REQUEST_S * 0.99
    signals._record(signal.SIGINT, None)
    assert (signals.received, signals.merged) == (["SIGINT"], 3)
    now[0] = 100.0 + SAME_REQUEST_S  # a person's second Ctrl-C
    signals._record(signal.SIGINT, None)
    assert signals.received == ["SIGINT", "SIGINT"]


def test_help_and_tutorial_state_the_window_in_which_signals_are_one_request() -> None:
    """``--help`` and the tutorial say how far apart two Ctrl-C must be to kill (the declared ``SAME_REQUEST_S``)."""
    text = " ".join(parser().format_help().split())
    assert f"within {SAME_REQUEST_S * 1000:.0f} ms of the first are that one request" in text, text
    tutorial = " ".join((Path(__file__).parents[2] / "docs" / "tutorial.md").read_text().split())
    assert f"Signals within {SAME_REQUEST_S * 1000:.0f} ms of the first are that first request" in tutorial


@pytest.mark.timeout(150)
@pytest.mark.skipif(shutil.which("timeout") is None, reason="needs GNU timeout")
def test_one_ctrl_c_under_timeout_is_one_graceful_stop_with_a_final_checkpoint(tmp_path: Path) -> None:
    """``timeout 300 demo``, one SIGINT to its process group (timeout forwards copies): exit 75, a final checkpoint."""
    journal, checkpoints = tmp_path / "journal", tmp_path / "checkpoints"
    args = (*ENDLESS, f"--journal-dir={journal}", f"--checkpoint-dir={checkpoints}")
    with started_demo(*args, cwd=tmp_path, wrapper=("timeout", "300")) as demo:
        demo.wait_for(TRAINING, timeout=90)
        os.killpg(demo.process.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole foreground group
        done = demo.finish(timeout=90)
        assert demo.left_running() == [], done.stdout[-3000:]
    assert "again: killed" not in done.stdout, done.stdout[-3000:]
    assert done.returncode == ExitCode.STOPPED, done.stdout[-3000:]
    end = ends(journal)
    assert {rank: e.state for rank, e in end.items()} == {0: "closed", 1: "closed"}, end
    assert end[0].final_step == end[1].final_step == end[0].checkpoint_step, end
    assert json.loads((checkpoints / "latest").read_bytes())["step"] == end[0].checkpoint_step


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
