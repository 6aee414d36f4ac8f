"""Exit codes that say what to do next (``lifecycle.exit_code``): one per outcome, and the no-progress rule."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from lifecycle import ConfigError, ExitCode, ExitReason, InjectedFault, Phase, StoppedByLauncher, exit_code
from lifecycle.journal import JournalWriter, Origin, RunEnd, RunStart, TrainStep, journal_path

RUN = "run-exits"


@dataclass(frozen=True)
class _Result:
    """Stands for a ``PretrainResult``: ``exit_code`` reads only its ``exit_reason``."""

    exit_reason: ExitReason


def test_a_result_that_did_every_step_is_success() -> None:
    """A call whose loop did every step exits ``SUCCESS`` (0)."""
    assert exit_code(_Result(ExitReason.ITERATIONS)) == ExitCode.SUCCESS == 0


@pytest.mark.parametrize("reason", [ExitReason.REQUESTED, ExitReason.MAX_DURATION])
def test_a_requested_stop_is_stopped(reason: ExitReason) -> None:
    """A call that stopped on request or on its time limit exits ``STOPPED``: the stop was asked for."""
    assert exit_code(_Result(reason)) == ExitCode.STOPPED


def test_a_failure_after_a_requested_exit_is_stopped() -> None:
    """A failure that carries ``requested_exit`` (the session's note) exits ``STOPPED``, as does Ctrl-C."""
    error = RuntimeError("peer gone")
    error.requested_exit = "SIGTERM"  # type: ignore[attr-defined]
    assert exit_code(error) == exit_code(KeyboardInterrupt()) == ExitCode.STOPPED


def test_an_ordinary_failure_and_the_launchers_stop_are_worth_restarting() -> None:
    """An injected fault, a lost peer, and the launcher's stop after a peer died exit ``RESTART`` (1)."""
    stopped = RuntimeError("Connection reset by peer")
    stopped.stopped_by_launcher = "SIGTERM after rank 1 died"  # type: ignore[attr-defined]
    stopped.requested_exit = "SIGTERM"  # type: ignore[attr-defined]  # the launcher's stop wins over it
    outcomes = [InjectedFault(Phase.STEP, 1, 3), stopped, StoppedByLauncher("SIGTERM", "rank 1 died")]
    assert [exit_code(o) for o in outcomes] == [ExitCode.RESTART] * 3 == [1] * 3


def test_a_configuration_error_is_not_worth_restarting() -> None:
    """A ``ConfigError`` exits ``DO_NOT_RESTART`` (93): a restart reads the same configuration."""
    assert exit_code(ConfigError("training.iterations", "must be above 0")) == ExitCode.DO_NOT_RESTART == 93


def test_a_refused_checkpoint_layout_is_not_worth_restarting() -> None:
    """A ``CheckpointMismatch`` (a layout the run cannot load) exits ``DO_NOT_RESTART``."""
    from lifecycle.checkpoint import CheckpointMismatch

    assert exit_code(CheckpointMismatch("/ckpt/step-4", "the tensor-parallel size", 2, 1)) == ExitCode.DO_NOT_RESTART


def _attempt(journal: Path, restart: int, trained: list[int], committed: int | None, state: str = "failed") -> None:
    """Append one ``pretrain`` call of rank 0 (torchrun restart ``restart``) to the journal in ``journal``."""
    origin = Origin(run_id=RUN, rank=0, attempt=0, restart_mode="ordinary", iteration=0, restart_count=restart)
    with JournalWriter(
        journal_path(journal, 0), RunStart(origin=origin, world_size=1, pid=os.getpid(), host="host", start=0.0)
    ) as writer:
        for step in trained:
            writer.write(TrainStep(origin=origin, step=step, loss=1.0, start=None, end=None))
        final = trained[-1] if trained else 0
        end = RunEnd(
            origin=origin,
            state=state,
            exit_reason=None,
            final_step=final,
            checkpoint_step=committed,
            error="x",
            end=None,
        )
        writer.write(end)


def test_three_attempts_in_a_row_without_a_new_committed_step_are_not_worth_restarting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The third failed call in a row that committed no step it trained exits ``DO_NOT_RESTART``; progress resets it."""
    monkeypatch.setenv("LIFECYCLE_RUN_ID", RUN)
    error = InjectedFault(Phase.STEP, 0, 6)
    _attempt(tmp_path, 0, [1, 2, 3, 4, 5, 6], 4)  # progress: committed 4, trained 1..6
    assert exit_code(error, tmp_path, rank=0) == ExitCode.RESTART
    _attempt(tmp_path, 1, [5, 6], 4)
    _attempt(tmp_path, 2, [5, 6], 4)
    assert exit_code(error, tmp_path, rank=0) == ExitCode.RESTART  # two in a row
    _attempt(tmp_path, 3, [5, 6], 4)
    assert exit_code(error, tmp_path, rank=0) == ExitCode.DO_NOT_RESTART  # three in a row
    assert exit_code(error, tmp_path, rank=0, no_progress_limit=4) == ExitCode.RESTART
    _attempt(tmp_path, 4, [5, 6, 7, 8, 9], 8)  # progress again
    assert exit_code(error, tmp_path, rank=0) == ExitCode.RESTART
    monkeypatch.setenv("LIFECYCLE_RUN_ID", "another-run")  # another run's attempts do not count
    assert exit_code(error, tmp_path, rank=0, no_progress_limit=1) == ExitCode.RESTART
