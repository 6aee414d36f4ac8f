"""The job's decision under NVRx's Wrapper: after each failed iteration, restart or stop (exit 93), as elsewhere.

NVRx restarts a failed iteration until its own ``max_iterations``, whatever the cause: a
failure that is reproducible (the same raise at the same step) burns every restart. Here
the Wrapper's ``finalize`` (main thread, every rank, after the iteration failed) makes
the job's decision with ``decide_after``, the same helper a retry loop of one's own, the
demo's ``--retry`` and a torchrun worker use: once for the job (the rank whose own
failure is the cause records it in the journal folder, the others read it), journaled.
The Wrapper's ``initialize`` of the next iteration then ends the restarts on a ``stop``,
where NVRx's own ``RetryController`` ends them, with ``RestartStopped``: every rank
raises it, since every rank read the same decision.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from nvidia_resiliency_ext.inprocess.exception import RestartAbort
from nvidia_resiliency_ext.inprocess.finalize import Finalize
from nvidia_resiliency_ext.inprocess.initialize import Initialize

from lifecycle._training.decide import Decision, RestartPolicy
from lifecycle._training.exits import ExitCode
from lifecycle._training.retry import decide_after, last_decision
from lifecycle.journal.evidence import Kind

WRAPPER_WAIT_S = 5.0
"""How long a rank that is not the cause waits for the cause's decision under the Wrapper: the cause is alive (the
Wrapper restarts only after a raise it caught) and decides as soon as its ``finalize`` runs; this bounds only a
cause that never does."""


class RestartStopped(RestartAbort):  # type: ignore[misc]  # NVRx is untyped
    """The job decided not to restart after a failed iteration: the Wrapper's call raises this instead of restarting.

    ``decision``: the job's ``lifecycle.lowlevel.Decision`` (a ``stop``, with its
    ``reason``: ``reproducible``, ``budget``, ``repeated_culprit``, ``no_progress`` or
    ``not_restartable``, and its ``words``), the same on every rank and in the journal
    folder's ``decision.json``; ``exit_code``: ``ExitCode.DO_NOT_RESTART`` (93), which
    ``lifecycle.exit_code`` returns for it too. A ``RestartAbort``, NVRx's terminal
    ``BaseException``: code that handles the end of the Wrapper's restarts handles it, and
    a retry loop that catches ``Exception`` does not start again.
    """

    def __init__(self, decision: Decision) -> None:
        """Carry ``decision`` (a stop); the message is its ``line()``."""
        self.decision = decision
        super().__init__(f"the job decided not to restart: {decision.line()}")

    @property
    def exit_code(self) -> ExitCode:
        """``ExitCode.DO_NOT_RESTART`` (93): the decision's code."""
        return self.decision.exit_code

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.decision,), self.__dict__)


class _RestartedForAPeer(Exception):
    """What this rank's iteration failed with when the Wrapper gave it nothing (it restarted it for a peer's
    failure): a consequence, so this rank is never taken for the cause."""

    failure_kind = Kind.STOPPED_BY_LAUNCHER


@dataclass
class Decisions:
    """The decisions of one Wrapper: where they are kept and the last one made (None: no iteration failed yet)."""

    journal_dir: str | os.PathLike[str]
    policy: RestartPolicy | None = None
    wait_s: float = WRAPPER_WAIT_S
    last: Decision | None = None


class DecideAfterFailure(Finalize):  # type: ignore[misc]  # NVRx is untyped
    """The Wrapper's ``finalize`` step that makes the job's decision after the failed iteration (``decide_after``)."""

    def __init__(self, decisions: Decisions) -> None:
        """Keep the decision in ``decisions``."""
        self.decisions = decisions

    def __call__(self, state: Any) -> Any:
        """Decide from the iteration's exception (a stand-in consequence if the Wrapper has none); return ``state``."""
        error = state.fn_exception
        if not isinstance(error, BaseException):
            error = _RestartedForAPeer(f"iteration {state.iteration} was restarted for another rank's failure")
        decisions = self.decisions
        decisions.last = decide_after(error, decisions.journal_dir, policy=decisions.policy, wait_s=decisions.wait_s)
        return state


class StopWhenDecided(Initialize):  # type: ignore[misc]  # NVRx is untyped
    """The Wrapper's ``initialize`` step that raises ``RestartStopped`` when the last decision was a stop.

    Before the first iteration the last decision is the run's, read from the journal
    folder (``last_decision``), as a worker torchrun restarted reads it: a Wrapper
    started in a job that already decided to stop runs nothing.
    """

    def __init__(self, decisions: Decisions) -> None:
        """Read the decision from ``decisions``."""
        self.decisions = decisions

    def __call__(self, state: Any) -> Any:
        """Return ``state`` unless the job decided to stop; then raise ``RestartStopped``."""
        if self.decisions.last is None and state.iteration == 0:
            self.decisions.last = last_decision(self.decisions.journal_dir)
        last = self.decisions.last
        if last is not None and last.stop:
            raise RestartStopped(last)
        return state
