"""Running a teardown plan: every step runs, every failure is kept."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from lifecycle._core.errors import LifecycleError
from lifecycle._core.ownership import Ledger, LedgerEntry
from lifecycle._core.plans import Outcome, Plan, RestartMode, Step, StepKind


@dataclass(frozen=True, slots=True)
class StepFailure:
    """A teardown step and the error it raised."""

    step: Step
    error: BaseException


@dataclass(frozen=True, slots=True)
class StepRecord:
    """A step that ran: how long it took and what it raised, if anything."""

    step: Step
    duration_s: float
    error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class TeardownReport:
    """What a teardown did: steps run (with durations and errors) and what it left alone, and why."""

    outcome: Outcome
    restart_mode: RestartMode
    records: tuple[StepRecord, ...]
    left: tuple[tuple[LedgerEntry, str], ...]

    @property
    def ran(self) -> tuple[Step, ...]:
        """Every step that ran, in order, whether or not it raised."""
        return tuple(r.step for r in self.records)

    @property
    def failed(self) -> tuple[StepFailure, ...]:
        """The steps that raised, in order."""
        return tuple(StepFailure(r.step, r.error) for r in self.records if r.error is not None)

    @property
    def skipped(self) -> tuple[tuple[LedgerEntry, str], ...]:
        """Held resources the session did not release, each with the reason."""
        return self.left

    @property
    def deferred_to_wrapper(self) -> bool:
        """True if the release of any resource was left to the restart wrapper."""
        return any(reason.startswith("deferred") for _, reason in self.left)

    def lines(self) -> list[str]:
        """Human-readable lines, one a step, then one a resource left alone."""
        out = [
            f"{r.step} {r.duration_s * 1000:.1f} ms" + (f" FAILED: {r.error!r}" if r.error else "")
            for r in self.records
        ]
        out += [f"left {entry}: {reason}" for entry, reason in self.left]
        return out


class TeardownError(LifecycleError):
    """Success teardown had failing steps; ``failures`` lists every one, in order."""

    def __init__(self, failures: tuple[StepFailure, ...]) -> None:
        self.failures = failures
        listed = "; ".join(f"{f.step}: {f.error!r}" for f in failures)
        super().__init__(f"{len(failures)} teardown step(s) failed: {listed}")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.failures,), self.__dict__)


def execute(
    plan: Plan,
    perform: Callable[[Step], None],
    ledger: Ledger,
    *,
    outcome: Outcome,
    restart_mode: RestartMode,
    left: tuple[tuple[LedgerEntry, str], ...] = (),
    on_step: Callable[[StepRecord], None] | None = None,
) -> tuple[TeardownReport, Ledger]:
    """Run every step of ``plan`` through ``perform``, even after one raised.

    Returns the report and the ledger with each successfully released resource
    marked released. ``Exception``s and ``KeyboardInterrupt``s raised by a step are
    recorded, not propagated; so is ``SystemExit``: teardown is never cut short.
    ``on_step``, if given, is called with each step's record as soon as the step ran;
    it must not raise.
    """
    records: list[StepRecord] = []
    for step in plan:
        start = time.monotonic()
        error: BaseException | None = None
        try:
            perform(step)
        except BaseException as exc:  # noqa: BLE001 - every later step must still run
            error = exc
        record = StepRecord(step, time.monotonic() - start, error)
        records.append(record)
        if on_step is not None:
            on_step(record)
        if error is None and step.kind is not StepKind.BARRIER:
            ledger = ledger.release(step.entry)
    return TeardownReport(outcome, restart_mode, tuple(records), left), ledger
