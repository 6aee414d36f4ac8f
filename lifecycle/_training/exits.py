"""Exit codes that say what to do next, and the error a launcher's stop becomes.

One table (``ExitCode``, documented in docs/recovery.md) for a training process:
the user's script ends with ``sys.exit(lifecycle.exit_code(outcome, journal_dir))``,
the demo's ranks and the demo itself use the same codes. ``exit_code`` reads the
outcome of the last ``pretrain`` call (its result, or what it raised) and, for a
failure worth restarting, this rank's journal: ``NO_PROGRESS_LIMIT`` attempts in a row
that committed no new step mean a restart would fail the same way, so the answer
becomes "do not restart". No torch import here.
"""

from __future__ import annotations

import os
import sys
from enum import IntEnum
from pathlib import Path

from lifecycle._core.errors import ConfigError, InvalidTransition, SessionFinished, UnfinishedSession
from lifecycle.journal import RunEnd, TrainStep, journal_path, load, run_id
from lifecycle.journal.evidence import Kind

STOPPED_BY_LAUNCHER = Kind.STOPPED_BY_LAUNCHER.value
"""A failed call's ``exit_reason`` in its journal's ``end`` record when the launcher stopped it after a peer failed."""

NO_PROGRESS_LIMIT = 3
"""Attempts in a row with no new committed step after which ``exit_code`` says ``DO_NOT_RESTART`` (NVRx's default)."""


class ExitCode(IntEnum):
    """What a training process's exit code tells whoever runs it (torchrun's caller, a job script, a scheduler).

    Each member is declared once with its ``meaning`` and what to do next (``next_step``; Markdown:
    code in backticks); the tables of docs/recovery.md and docs/reference.md and the
    demo's ``--help`` are rendered from them (``lifecycle._tools.cli.usage``). torchrun
    itself reads none of them: with ``--max-restarts`` it restarts every worker after any
    non-zero exit, until the restarts are spent (see docs/recovery.md).
    """

    meaning: str
    """What happened, in one sentence (Markdown)."""
    next_step: str
    """What whoever runs the process should do next (Markdown)."""

    def __new__(cls, value: int, meaning: str = "", next_step: str = "") -> ExitCode:
        """A member: ``value``, its ``meaning`` and ``next_step``; a lookup (``ExitCode(75)``) never calls it."""
        member = int.__new__(cls, value)
        member._value_ = value
        member.meaning, member.next_step = meaning, next_step
        return member

    SUCCESS = 0, "every step done, the session `closed`", "nothing"
    RESTART = (
        1,
        "failed; a restart from the last committed checkpoint may get further: a lost peer, a crash, a hang, a "
        "transient error, the launcher's stop after a peer died (Python's own code for an uncaught exception)",
        "restart (torchrun `--max-restarts`, a scheduler's requeue)",
    )
    # 2: argparse's own code for a refused argument.
    USAGE = 2, "the demo refused an option before starting anything", "fix the command"
    STOPPED = (  # 75: EX_TEMPFAIL, "try again later"
        75,
        "a requested stop (SIGTERM forwarded by the launcher, `exit.max_duration_s`, `Session.request_exit`, "
        "Ctrl-C), closed with a final checkpoint, or a failure after such a request",
        "resubmit to continue",
    )
    DO_NOT_RESTART = (  # 93: NVRx's launcher's own "do not restart" code
        93,
        "the job decided not to restart (`decide_after`, one JSON line in `decision.json`): a `ConfigError`, a "
        "refused checkpoint layout (`CheckpointMismatch`) or misuse of a session; the same failure replayed "
        "(reproducible); the same host or rank the cause of 3 attempts in a row (repeated culprit); the job's "
        f"restart budget spent; or {NO_PROGRESS_LIMIT} (`NO_PROGRESS_LIMIT`) attempts in a row that committed no "
        "step they trained",
        "fix it first; for a repeated culprit, exclude its host and resubmit",
    )


class StoppedByLauncher(BaseException):
    """The launcher stopped this rank (``signal``, e.g. SIGTERM) because another rank failed: ``why`` says which.

    Its ``failure_kind`` is ``Kind.STOPPED_BY_LAUNCHER``: a consequence, never the cause.

    Not a requested exit: the rank takes the failure edge at once (no final save); a
    restart resumes from the last committed checkpoint (``exit_code``: ``RESTART``). A
    ``BaseException``, like ``KeyboardInterrupt``: the process was told to end, so a
    retry loop that catches ``Exception`` does not start another attempt in it.
    """

    failure_kind = Kind.STOPPED_BY_LAUNCHER

    def __init__(self, signal: str, why: str) -> None:
        """Record the signal's name and the peer's failure, as evidence."""
        self.signal, self.why = signal, why
        super().__init__(f"stopped by the launcher ({signal}) after {why}")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.signal, self.why), self.__dict__)


_NOT_WORTH_RESTARTING: tuple[type[BaseException], ...] = (
    ConfigError,
    InvalidTransition,
    SessionFinished,
    UnfinishedSession,
)
"""Errors a restart meets again: the configuration, the calling code (and the checkpoint's: ``_not_worth``)."""

_CHECKPOINT_REFUSALS = ("CheckpointMismatch",)
"""``lifecycle.checkpoint.errors``' refusal that repeats: a checkpoint (its layout, its shapes) this run cannot load.

An unreadable one is not here: the next attempt may read another (``CheckpointUnreadable``'s contract)."""


def _not_worth_restarting(error: BaseException) -> bool:
    """True for an error a restart meets again (``_NOT_WORTH_RESTARTING``, or a checkpoint refusal)."""
    if isinstance(error, _NOT_WORTH_RESTARTING):
        return True
    # Looked up only if loaded (it imports torch): an error of a module never imported is none of its classes.
    errors = sys.modules.get("lifecycle.checkpoint.errors")
    return errors is not None and isinstance(error, tuple(getattr(errors, name) for name in _CHECKPOINT_REFUSALS))


def exit_code(
    outcome: object,
    journal_dir: str | os.PathLike[str] | None = None,
    *,
    rank: int | None = None,
    no_progress_limit: int = NO_PROGRESS_LIMIT,
) -> ExitCode:
    """The exit code for a process whose last ``pretrain`` call ended with ``outcome``; never raises.

    ``outcome`` is what the call returned (a ``PretrainResult``) or raised. A result:
    ``SUCCESS`` when its loop did every step, ``STOPPED`` when an exit was requested or
    the time ran out. An exception: ``STOPPED`` if an exit had been requested before it
    (``requested_exit``) or it is a ``KeyboardInterrupt``/``SystemExit``;
    ``DO_NOT_RESTART`` for a configuration error, a refused checkpoint (``CheckpointMismatch``),
    misuse of a session, or an error carrying the job's ``decision`` to stop
    (``lifecycle.restart.RestartStopped``); otherwise ``RESTART`` (``StoppedByLauncher`` and a failure the
    launcher stopped included) — unless ``journal_dir`` is given and this rank's
    journal there (``rank``: default the ``RANK`` environment variable, else 0) shows
    ``no_progress_limit`` attempts of this run in a row, the last included, that ended
    without committing a step they trained: then ``DO_NOT_RESTART``.
    """
    if not isinstance(outcome, BaseException):
        reason = getattr(outcome, "exit_reason", None)
        return ExitCode.SUCCESS if reason is None or str(reason) == "iterations" else ExitCode.STOPPED
    launcher = isinstance(outcome, StoppedByLauncher) or getattr(outcome, "stopped_by_launcher", None) is not None
    requested = getattr(outcome, "requested_exit", None) is not None
    if not launcher and (requested or isinstance(outcome, KeyboardInterrupt | SystemExit)):
        return ExitCode.STOPPED
    if _not_worth_restarting(outcome) or getattr(getattr(outcome, "decision", None), "stop", False) is True:
        return ExitCode.DO_NOT_RESTART
    if journal_dir is not None and no_progress_limit > 0:
        rank = int(os.environ.get("RANK", "0")) if rank is None else rank
        if attempts_without_progress(journal_dir, rank) >= no_progress_limit:
            return ExitCode.DO_NOT_RESTART
    return ExitCode.RESTART


def attempts_without_progress(journal_dir: str | os.PathLike[str], rank: int, run: str | None = None) -> int:
    """How many of this run's last ``pretrain`` calls on ``rank``, in a row, failed without a new committed step.

    Read from ``rank``'s journal in ``journal_dir`` (0 if there is none or it cannot be
    read). ``run``: the run id (default ``lifecycle.journal.run_id()``: torchrun's, kept
    across its restarts). A call made progress if it ended with a committed checkpoint
    at or after a step it trained itself; a call that ended ``closed`` ends the count.
    """
    path = journal_path(Path(journal_dir), rank)
    run = run_id() if run is None else run
    try:
        records = load([path]).records if path.exists() else ()
    except (OSError, ValueError):
        return 0
    first_step: dict[object, int] = {}
    streak = 0
    for record in records:
        if record.origin.run_id != run:
            continue
        if isinstance(record, TrainStep):
            first_step.setdefault(record.origin, record.step)
        elif isinstance(record, RunEnd):
            trained = first_step.get(record.origin)
            committed = record.checkpoint_step
            progress = trained is not None and committed is not None and committed >= trained
            if record.state != "failed" or progress:
                streak = 0
            else:
                streak += 1
    return streak
