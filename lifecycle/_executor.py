"""Running a teardown plan: every step runs, every failure is kept."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from lifecycle._ownership import Ledger, LedgerEntry, Owner
from lifecycle._plans import Outcome, Plan, RestartMode, Step, StepKind


class DistributedActions(Protocol):
    """What a session does to torch.distributed and Megatron-core.

    Each ``init_*`` method acquires one resource and returns ``Owner.SESSION`` if it
    created it or ``Owner.CALLER`` if it found it already there; if it raises, it has
    acquired nothing. Each release method releases exactly one resource.
    ``lifecycle.testing.RecordingActions`` is a recording double.
    """

    def init_process_group(self) -> Owner:
        """Create (or find) the default process group."""

    def init_model_parallel(self) -> Owner:
        """Create (or find) the model-parallel groups and global memory buffer."""

    def init_microbatch_calculator(self) -> Owner:
        """Create (or find) the microbatch calculator."""

    def init_rerun_state_machine(self) -> Owner:
        """Create (or find) the rerun state machine."""

    def destroy_rerun_state_machine(self) -> None:
        """Destroy the rerun state machine."""

    def destroy_microbatch_calculator(self) -> None:
        """Destroy the microbatch calculator."""

    def destroy_model_parallel(self) -> None:
        """Destroy the model-parallel groups and the global memory buffer."""

    def barrier(self) -> None:
        """Wait for every rank of the default group (success teardown only)."""

    def destroy_process_group(self) -> None:
        """Destroy the default process group after a barrier (success)."""

    def abort_process_group(self) -> None:
        """Abort every process group without waiting on outstanding collectives (failure)."""


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


def execute(
    plan: Plan,
    perform: Callable[[Step], None],
    ledger: Ledger,
    *,
    outcome: Outcome,
    restart_mode: RestartMode,
    left: tuple[tuple[LedgerEntry, str], ...] = (),
) -> tuple[TeardownReport, Ledger]:
    """Run every step of ``plan`` through ``perform``, even after one raised.

    Returns the report and the ledger with each successfully released resource
    marked released. ``Exception``s and ``KeyboardInterrupt``s raised by a step are
    recorded, not propagated; so is ``SystemExit``: teardown is never cut short.
    """
    records: list[StepRecord] = []
    for step in plan:
        start = time.monotonic()
        error: BaseException | None = None
        try:
            perform(step)
        except BaseException as exc:  # noqa: BLE001 - every later step must still run
            error = exc
        records.append(StepRecord(step, time.monotonic() - start, error))
        if error is None and step.kind is not StepKind.BARRIER:
            ledger = ledger.release(step.entry)
    return TeardownReport(outcome, restart_mode, tuple(records), left), ledger
