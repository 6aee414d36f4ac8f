"""Teardown plans: a pure function of (ledger, restart mode, outcome).

Every plan is a subsequence of one canonical order (``StepKind`` is declared in
that order). ``Plan`` refuses any other order, so a wrong order cannot be
built, by ``plan_teardown`` or by anyone else.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from enum import Enum, StrEnum

from lifecycle._core.ownership import GLOBALS, Ledger, LedgerEntry, Owner, Resource


class RestartMode(StrEnum):
    """Whether the session runs under an in-process restart wrapper."""

    ORDINARY = "ordinary"
    INPROCESS = "inprocess"


class Outcome(StrEnum):
    """How the session ended."""

    SUCCESS = "success"
    FAILURE = "failure"


class StepKind(Enum):
    """A teardown action. Declaration order is the canonical order."""

    FINALIZE_CHECKPOINTS = "finalize_checkpoints"
    ABORT_CHECKPOINTS = "abort_checkpoints"
    RELEASE_USER_RESOURCE = "release_user_resource"
    DESTROY_RERUN_STATE_MACHINE = "destroy_rerun_state_machine"
    DESTROY_MICROBATCH_CALCULATOR = "destroy_microbatch_calculator"
    DESTROY_MODEL_PARALLEL = "destroy_model_parallel"
    BARRIER = "barrier"
    DESTROY_PROCESS_GROUP = "destroy_process_group"
    ABORT_PROCESS_GROUP = "abort_process_group"
    RESTORE_SIGNAL_HANDLERS = "restore_signal_handlers"

    @property
    def rank(self) -> int:
        """Position in the canonical order."""
        return _RANK[self]


_RANK = {kind: i for i, kind in enumerate(StepKind)}

# Each resource's step: (on success, on failure).
_KIND: dict[Resource, tuple[StepKind, StepKind]] = {
    Resource.ASYNC_CHECKPOINT: (StepKind.FINALIZE_CHECKPOINTS, StepKind.ABORT_CHECKPOINTS),
    Resource.USER: (StepKind.RELEASE_USER_RESOURCE, StepKind.RELEASE_USER_RESOURCE),
    Resource.RERUN_STATE_MACHINE: (StepKind.DESTROY_RERUN_STATE_MACHINE,) * 2,
    Resource.MICROBATCH_CALCULATOR: (StepKind.DESTROY_MICROBATCH_CALCULATOR,) * 2,
    Resource.MODEL_PARALLEL: (StepKind.DESTROY_MODEL_PARALLEL,) * 2,
    Resource.PROCESS_GROUP: (StepKind.DESTROY_PROCESS_GROUP, StepKind.ABORT_PROCESS_GROUP),
    Resource.SIGNAL_HANDLERS: (StepKind.RESTORE_SIGNAL_HANDLERS,) * 2,
}

LEFT_TO_CALLER = "owned by the caller"
LEFT_TO_WRAPPER = "deferred to the restart wrapper"


@dataclass(frozen=True, slots=True)
class Step:
    """One teardown action on one ledger entry."""

    kind: StepKind
    entry: LedgerEntry

    def __str__(self) -> str:
        return f"{self.kind.value}:{self.entry.name}" if self.entry.name else self.kind.value


class Plan(tuple[Step, ...]):
    """An ordered tuple of steps, guaranteed to follow the canonical order."""

    __slots__ = ()

    def __new__(cls, steps: tuple[Step, ...] = ()) -> Plan:
        """Build a plan; raise ``ValueError`` unless ``steps`` follow the canonical order.

        Only user resources may have several steps of one kind.
        """
        for before, after in itertools.pairwise(steps):
            if before.kind.rank > after.kind.rank or (
                before.kind is after.kind and before.kind is not StepKind.RELEASE_USER_RESOURCE
            ):
                raise ValueError(f"{after} may not follow {before}: not the canonical teardown order")
        return super().__new__(cls, steps)


def _left_because(entry: LedgerEntry, mode: RestartMode, outcome: Outcome) -> str | None:
    """Why the session does not release ``entry`` itself, or None if it does."""
    if entry.owner is Owner.CALLER:
        return LEFT_TO_CALLER
    wrapper_scope = entry.resource is Resource.PROCESS_GROUP or entry.resource in GLOBALS
    if outcome is Outcome.FAILURE and (
        entry.owner is Owner.RESTART_WRAPPER or (mode is RestartMode.INPROCESS and wrapper_scope)
    ):
        return LEFT_TO_WRAPPER
    return None


def plan_teardown(ledger: Ledger, restart_mode: RestartMode, outcome: Outcome) -> Plan:
    """Return the steps that release what ``ledger`` still holds, in the canonical order.

    Caller-owned resources get no step. A failure plan never has a barrier; under
    ``inprocess`` failure the process group and the Megatron globals are left to the
    restart wrapper. A success plan has a barrier right before the group is destroyed.
    User resources are released in reverse registration order.
    """
    steps: list[Step] = []
    for entry in reversed(ledger.held()):
        if _left_because(entry, restart_mode, outcome) is None:
            kind = _KIND[entry.resource][outcome is Outcome.FAILURE]
            if kind is StepKind.DESTROY_PROCESS_GROUP:
                steps.append(Step(StepKind.BARRIER, entry))
            steps.append(Step(kind, entry))
    # A stable sort keeps reverse acquisition order among user resources.
    return Plan(tuple(sorted(steps, key=lambda step: step.kind.rank)))


def left_alone(ledger: Ledger, restart_mode: RestartMode, outcome: Outcome) -> tuple[tuple[LedgerEntry, str], ...]:
    """Return the held entries ``plan_teardown`` gives no step, each with the reason."""
    left = ((entry, _left_because(entry, restart_mode, outcome)) for entry in ledger.held())
    return tuple((entry, reason) for entry, reason in left if reason is not None)
