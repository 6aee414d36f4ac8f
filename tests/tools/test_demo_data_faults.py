"""The demo's data faults: ``--fault save-error`` (one rank's write fails with ENOSPC) and ``--fault nan``.

A failed save is tolerated by default and listed by ``show``; a NaN loss fails naming the rank and step by default,
and is skipped and counted under ``--on-nonfinite-loss skip`` (issue 41).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.launch import run_demo

from lifecycle import ExitCode
from lifecycle.journal import FailedSave, StepSkipped, read

BASE = ("--steps", "40", "--checkpoint-interval", "10", "--eval-interval", "0")
"""The fault fires at step 20 (half the steps) on rank 1 (the last rank), a replica at TP1."""


@pytest.mark.slow  # 7 s; test_save_faults.py keeps a failed save, agreed and journaled, in make test
@pytest.mark.timeout(120)
def test_demo_save_error_finishes_and_show_lists_the_failed_save(tmp_path: Path) -> None:
    """``--fault save-error``: exit 0, both ranks journal step 20's failed save (rank 1, ENOSPC); show lists it."""
    done = run_demo(*BASE, "--fault", "save-error", "--journal-dir", str(tmp_path), timeout=100, cwd=tmp_path)
    assert done.returncode == ExitCode.SUCCESS, done.stdout[-4000:]
    failed = [r for r in read([tmp_path]) if isinstance(r, FailedSave)]
    assert sorted((r.origin.rank, r.step, r.action) for r in failed) == [(0, 20, "continued"), (1, 20, "continued")]
    assert all("rank 1" in r.error and "ENOSPC" in r.error for r in failed)
    assert "checkpoint step 40; 1 failed save (step 20)" in done.stdout


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_demo_save_error_with_on_save_error_fail_fails_naming_the_rank_and_the_error(tmp_path: Path) -> None:
    """``--on-save-error fail``: the save of step 20 fails the attempt (exit 1), naming rank 1 and ENOSPC."""
    args = (*BASE, "--fault", "save-error", "--on-save-error", "fail", "--journal-dir", str(tmp_path))
    done = run_demo(*args, timeout=100, cwd=tmp_path)
    assert done.returncode == ExitCode.RESTART, done.stdout[-4000:]
    assert (
        "SaveFailed: checkpoint step 20" in done.stdout
        and "rank 1 (a replica) failed its save: [Errno 28 ENOSPC]" in done.stdout
    )


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_demo_nan_fails_naming_rank_and_step(tmp_path: Path) -> None:
    """``--fault nan``: exit 1, every rank says the loss of step 20 is nan on rank 1; step 10 is the last committed."""
    done = run_demo(*BASE, "--fault", "nan", "--journal-dir", str(tmp_path), timeout=100, cwd=tmp_path)
    assert done.returncode == ExitCode.RESTART, done.stdout[-4000:]
    assert done.stdout.count("NonfiniteLoss: the loss of step 20 is nan on rank 1") >= 2, done.stdout[-4000:]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_demo_nan_skipped_finishes_and_show_counts_it(tmp_path: Path) -> None:
    """``--on-nonfinite-loss skip``: exit 0, each rank journals step 20 skipped, show counts one skipped step."""
    args = (*BASE, "--fault", "nan", "--on-nonfinite-loss", "skip", "--journal-dir", str(tmp_path))
    done = run_demo(*args, timeout=100, cwd=tmp_path)
    assert done.returncode == ExitCode.SUCCESS, done.stdout[-4000:]
    skipped = [r for r in read([tmp_path]) if isinstance(r, StepSkipped)]
    assert sorted((r.origin.rank, r.step, r.ranks) for r in skipped) == [(0, 20, 1), (1, 20, 1)]
    assert "; 1 skipped step" in done.stdout
