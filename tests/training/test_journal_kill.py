"""Journals written as things happen: a rank killed with SIGKILL leaves a journal ``show`` reads; write errors."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest
from support.configs import config_of_one
from support.launch import run_bounded

from lifecycle import pretrain
from lifecycle.journal import JournalWriter, Record, RunEnd, RunStart, TrainStep, Transition, read

KILLED_AT = 5

WORKER = f"""
import os, signal, sys
from pathlib import Path

from support.configs import config_of_one
from lifecycle import Callback, pretrain


class KillAt(Callback):
    def on_step_end(self, session, step, loss):
        if step == {KILLED_AT}:
            os.kill(os.getpid(), signal.SIGKILL)  # no finally, no atexit, no flush


pretrain(config_of_one(Path(sys.argv[1]), iterations=50), callbacks=[KillAt()])
"""


@pytest.mark.timeout(120)
def test_a_rank_killed_mid_training_leaves_a_journal_show_reads_up_to_its_last_step(tmp_path: Path) -> None:
    """SIGKILL in step 5's callback: the journal holds the start, transitions and steps 1-5, and show prints them."""
    killed = run_bounded([sys.executable, "-c", WORKER, str(tmp_path)], timeout=100, cwd=tmp_path)
    assert killed.returncode == -signal.SIGKILL, killed.stdout
    records = read([tmp_path / "journal"])
    assert isinstance(records[0], RunStart) and not any(isinstance(r, RunEnd) for r in records)
    assert [r.dest for r in records if isinstance(r, Transition)] == ["dist_ready", "globals_ready", "training"]
    assert [r.step for r in records if isinstance(r, TrainStep)] == list(range(1, KILLED_AT + 1))

    command = [sys.executable, "-m", "lifecycle", "show", str(tmp_path / "journal"), "--out", str(tmp_path / "d")]
    shown = run_bounded(command, timeout=60, cwd=tmp_path)
    assert shown.returncode == 0, shown.stdout
    assert f"no end record (killed?) in state training — last step {KILLED_AT}" in shown.stdout
    for transition in ("uninitialized → dist_ready", "dist_ready → globals_ready", "globals_ready → training"):
        assert transition in shown.stdout
    assert f"step {KILLED_AT} ended" in shown.stdout and "→ failed" not in shown.stdout


def test_a_journal_write_error_never_changes_the_runs_outcome(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The disk fills after two records: the run still closes, a warning says so, and journaling stops."""
    write = JournalWriter.write
    calls: list[Record] = []

    def failing(self: JournalWriter, record: Record) -> None:
        calls.append(record)
        if len(calls) > 2:
            raise OSError(28, "No space left on device")
        write(self, record)

    monkeypatch.setattr(JournalWriter, "write", failing)
    result = pretrain(config_of_one(tmp_path))
    assert (result.final_step, result.journal[-1].dest.value) == (3, "closed")
    assert "No space left on device" in caplog.text and "not journaling the rest of this run" in caplog.text
    assert len(calls) == 3 and len(read([tmp_path / "journal"])) == 2


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
