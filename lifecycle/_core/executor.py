"""Running a teardown plan: every step runs, every failure is kept."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from lifecycle._core.errors import LifecycleError, describe
from lifecycle._core.ownership import LedgerEntry
from lifecycle._core.plans import LeftReason, Outcome, RestartMode, Step, Teardown
from lifecycle._core.shield import TeardownInterrupted


@dataclass(frozen=True, slots=True)
class StepFailure:
    """A teardown step and the error it raised."""

    step: Step
    error: BaseException


@dataclass(frozen=True, slots=True)
class StepRecord:
    """A step that ran: when it started (wall clock, ``time.time()``), how long it took, what it raised if anything.

    ``outcome``: the plan it belongs to (a failed ``close()`` runs success steps, then failure steps).
    """

    step: Step
    start: float
    duration_s: float
    error: BaseException | None = None
    outcome: Outcome = Outcome.FAILURE

    @property
    def end(self) -> float:
        """When it finished (wall clock): ``start`` plus its duration on the monotonic clock."""
        return self.start + self.duration_s


class Releaser(StrEnum):
    """Who ran a release of a session's entry; the values are the journal's ``teardown`` ``outcome`` words."""

    SUCCESS = "success"
    """A step of the session's own success plan."""
    FAILURE = "failure"
    """A step of the session's own failure plan."""
    WRAPPER_ABORT = "wrapper_abort"
    """The restart wrapper's ``abort`` (NVRx: its monitor thread), before, during or after the session's teardown."""
    WRAPPER_FINALIZE = "wrapper_finalize"
    """The restart wrapper's ``finalize`` (or ``restart.run`` for it, when an interrupt ended the Wrapper)."""
    LATE = "late"
    """A step of the session's plan left running past its deadline, which returned since."""

    @property
    def own_plan(self) -> bool:
        """True for the session's own plans, whose steps the session reports as they run."""
        return self in (Releaser.SUCCESS, Releaser.FAILURE)


@dataclass(frozen=True, slots=True)
class Released:
    """One release of a session's entry that ran to its end (raised or not): who ran it (``by``), what and when."""

    by: Releaser
    record: StepRecord


@dataclass(frozen=True, slots=True)
class TeardownReport:
    """What a teardown did: steps run (with start, duration and error) and what it left alone, and why."""

    outcome: Outcome
    restart_mode: RestartMode
    records: tuple[StepRecord, ...]
    left: tuple[tuple[LedgerEntry, LeftReason], ...]
    abandoned: tuple[Step, ...] = ()
    """Steps that never ran: an escalated interrupt (``TeardownInterrupted``) cut the teardown short."""
    interrupted: BaseException | None = None
    """The interrupt that cut it short, raised by the session once it is final; None if none did."""
    left_running: tuple[Step, ...] = ()
    """A step the session stopped waiting for while a worker ran it (it may still finish): neither ran nor abandoned."""
    released_elsewhere: tuple[Released, ...] = ()
    """Releases of the session's entries outside its own plans' steps, in the order they ended.

    The restart wrapper's abort (from NVRx's monitor thread, often before the session's
    failure plan was made: the plan then has no step for what it released) and finalize,
    and a step left running that returned late. ``Session.report`` fills it as of when it
    is read; a report made by the executor has none.
    """

    @property
    def ran(self) -> tuple[Step, ...]:
        """Every step that ran, in order, whether or not it raised."""
        return tuple(r.step for r in self.records)

    @property
    def released_by_wrapper(self) -> tuple[Released, ...]:
        """The releases of ``released_elsewhere`` that the restart wrapper's abort or finalize ran."""
        wrapper = (Releaser.WRAPPER_ABORT, Releaser.WRAPPER_FINALIZE)
        return tuple(r for r in self.released_elsewhere if r.by in wrapper)

    @property
    def failed(self) -> tuple[StepFailure, ...]:
        """The steps that raised, in order."""
        return tuple(StepFailure(r.step, r.error) for r in self.records if r.error is not None)

    @property
    def deferred_to_wrapper(self) -> tuple[LedgerEntry, ...]:
        """The held entries whose release was left to the restart wrapper (empty: none)."""
        return tuple(entry for entry, why in self.left if why is LeftReason.RESTART_WRAPPER)

    def lines(self) -> list[str]:
        """Human-readable lines, one a step, then one a resource left alone."""
        out = [
            f"{r.step} {r.duration_s * 1000:.1f} ms" + (f" FAILED: {r.error!r}" if r.error else "")
            for r in self.records
        ]
        out += [f"abandoned {step}" for step in self.abandoned]
        out += [f"left running {step}" for step in self.left_running]
        out += [f"released by {r.by.value} {r.record.step}" for r in self.released_elsewhere]
        out += [f"left {entry}: {reason}" for entry, reason in self.left]
        return out


class TeardownError(ExceptionGroup[Exception], LifecycleError):
    """Teardown steps raised these ``Exception``s; ``failures`` pairs each with its step, in order.

    An ``ExceptionGroup``: every failure's traceback prints, and ``except*`` /
    ``split`` / ``subgroup`` keep this type and the matching ``failures``. A step's
    ``BaseException`` that is not an ``Exception`` (Ctrl-C, ``SystemExit``, a restart
    request) is never in the group: it is raised after teardown, from the group (see
    ``raise_failures``).
    """

    failures: tuple[StepFailure, ...]

    def __new__(cls, failures: Sequence[StepFailure]) -> TeardownError:
        """Group the ``Exception`` failures of ``failures``; ``ValueError`` if there is none."""
        kept = tuple(f for f in failures if isinstance(f.error, Exception))
        if not kept:
            raise ValueError("a TeardownError needs at least one step that raised an Exception")
        listed = "; ".join(f"{f.step}: {describe(f.error)}" for f in kept)
        errors = [f.error for f in kept if isinstance(f.error, Exception)]
        self = super().__new__(cls, f"{len(kept)} teardown step(s) failed: {listed}", errors)
        self.failures = kept
        return self

    def __init__(self, failures: Sequence[StepFailure]) -> None:
        super().__init__(self.message, self.exceptions)

    def derive(self, excs: Sequence[Exception]) -> TeardownError:  # type: ignore[override]
        """The group of the failures whose errors are ``excs`` (``split`` and ``except*`` call this)."""
        by_error = {id(f.error): f for f in self.failures}
        return TeardownError(tuple(by_error[id(error)] for error in excs))

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.failures,), self.__dict__)


def raise_failures(failures: Sequence[StepFailure], cause: BaseException | None = None) -> None:
    """Raise what the teardown failures ``failures`` call for, or return if there are none.

    The first interruption (a ``BaseException`` that is not an ``Exception``) is raised
    from the ``TeardownError`` of the ``Exception`` failures if there are any, else from
    ``cause``; without an interruption, that ``TeardownError`` is raised from ``cause``.
    """
    interruption = next((f.error for f in failures if not isinstance(f.error, Exception)), None)
    group = TeardownError(failures) if any(isinstance(f.error, Exception) for f in failures) else None
    if interruption is not None:
        raise interruption from (group if group is not None else cause)
    if group is not None:
        raise group from cause


def execute(
    teardown: Teardown,
    perform: Callable[[Step], object],
    *,
    on_step: Callable[[StepRecord], None] | None = None,
    stop_at_failure: bool = False,
    escalated: Callable[[], BaseException | None] | None = None,
) -> TeardownReport:
    """Run the steps of ``teardown.plan`` through ``perform``: every one, or up to the first that raised.

    Returns the report; the ledger is the caller's to update, from ``on_step`` (a session
    does it step by step, so an interrupt between steps loses no release). Every
    ``BaseException`` a step raises (Ctrl-C and ``SystemExit`` too) is recorded, with a
    note naming the step and where its resource was acquired, not propagated. Without
    ``stop_at_failure`` every later step still runs; with it, the steps after the first
    failure do not run (the caller switches to another plan). Once interrupts escalated
    (``escalated()`` returns the interrupt, or a step raised ``TeardownInterrupted``; see
    ``lifecycle._core.shield``), the steps not yet run are ``abandoned`` except those of a
    kind that is not ``abandonable``, and the interrupt is reported as ``interrupted``,
    for the caller to raise once it is final. ``on_step``, if given, is called with each
    step's record as soon as the step ran; it must not raise.
    """
    records: list[StepRecord] = []
    abandoned: list[Step] = []
    interrupted: BaseException | None = None
    for step in teardown.plan:
        if interrupted is None and escalated is not None:
            interrupted = escalated()
        if interrupted is not None and step.kind.abandonable:
            abandoned.append(step)
            continue
        start, started = time.time(), time.monotonic()
        error: BaseException | None = None
        try:
            perform(step)
        except BaseException as exc:  # noqa: BLE001 - every later step must still run
            error = exc
            exc.add_note(f"lifecycle: raised by teardown step {step} of {step.entry.described()}")
        record = StepRecord(step, start, time.monotonic() - started, error, teardown.outcome)
        records.append(record)
        if on_step is not None:
            on_step(record)
        if isinstance(error, TeardownInterrupted):
            interrupted = error
        elif error is not None and stop_at_failure and interrupted is None:
            break
    return TeardownReport(teardown.outcome, teardown.mode, tuple(records), teardown.left, tuple(abandoned), interrupted)
