"""Teardown plans: one pure function of (ledger, restart mode, outcome) returns one ``Teardown`` value.

Every plan follows one canonical order: resource kinds by their declared ``order``,
and within one kind its steps as declared. ``Plan`` refuses any other order, so a
wrong order cannot be built, by ``teardown`` or by anyone else.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from enum import StrEnum

from lifecycle._core.errors import ForeignResource
from lifecycle._core.ownership import Ledger, LedgerEntry, Owner
from lifecycle._core.resources import Resource, StepKind, WrapperRole


class RestartMode(StrEnum):
    """Whether the session runs under an in-process restart wrapper."""

    ORDINARY = "ordinary"
    INPROCESS = "inprocess"


class Outcome(StrEnum):
    """How the session ended."""

    SUCCESS = "success"
    FAILURE = "failure"


class LeftReason(StrEnum):
    """Why a teardown gives a held resource no step; the values are the words printed."""

    CALLER = "owned by the caller"
    """The caller created it (the session found it) and releases it."""
    RESTART_WRAPPER = "deferred to the restart wrapper"
    """A failure under in-process restart: the wrapper releases it (its abort and finalize)."""
    RELEASE_FAILED = "its release raised, and runs at most once"
    """Its kind's release is not retried (``Resource.retry_release`` is False) and it already raised."""


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

        Only named resources (user resources) may have several steps of one kind.
        """
        for before, after in itertools.pairwise(steps):
            if before.kind.rank > after.kind.rank or (before.kind is after.kind and not before.kind.resource.named):
                raise ValueError(f"{after} may not follow {before}: not the canonical teardown order")
        return super().__new__(cls, steps)


@dataclass(frozen=True, slots=True)
class Teardown:
    """What a teardown of ``outcome`` in ``mode`` does: its ``plan``, and what it ``left`` alone and why."""

    plan: Plan
    left: tuple[tuple[LedgerEntry, LeftReason], ...]
    outcome: Outcome
    mode: RestartMode

    @property
    def deferred_to_wrapper(self) -> tuple[LedgerEntry, ...]:
        """The held entries left to the restart wrapper, in acquisition order."""
        return tuple(entry for entry, why in self.left if why is LeftReason.RESTART_WRAPPER)


def left_because(
    entry: LedgerEntry, mode: RestartMode, outcome: Outcome, failed: frozenset[tuple[Resource, str]] = frozenset()
) -> LeftReason | None:
    """Why a teardown of ``outcome`` in ``mode`` gives ``entry`` no step, or None if it releases it.

    The one place that decides wrapper scope: on a failure, an entry the wrapper owns,
    or under ``inprocess`` one of a kind the wrapper releases, is left to the wrapper.
    An entry in ``failed`` (its release raised) whose kind is not retried is left too.
    """
    if entry.owner is Owner.CALLER:
        return LeftReason.CALLER
    if entry.key in failed and not entry.resource.retry_release:
        return LeftReason.RELEASE_FAILED
    if outcome is Outcome.FAILURE and (
        entry.owner is Owner.RESTART_WRAPPER
        or (mode is RestartMode.INPROCESS and entry.resource.wrapper is WrapperRole.RELEASES)
    ):
        return LeftReason.RESTART_WRAPPER
    return None


def recorded_owner(resource: Resource, owner: Owner, mode: RestartMode) -> Owner:
    """Who a session records as the owner of ``resource`` it acquired as ``owner`` in ``mode``: the one owner rule.

    Under ``inprocess`` restart, a kind the wrapper releases (``WrapperRole.RELEASES``) is
    the wrapper's when the session created it, and refused (``ForeignResource``) when it
    was found: the wrapper could not release the caller's. Otherwise ``owner`` as it is.
    """
    if mode is RestartMode.INPROCESS and resource.wrapper is WrapperRole.RELEASES:
        if owner is Owner.CALLER:
            raise ForeignResource(
                resource.value,
                "already exists, created by the caller; under in-process restart the session must "
                "create it (the restart wrapper releases it on failure)",
            )
        return Owner.RESTART_WRAPPER
    return owner


def teardown(ledger: Ledger, restart_mode: RestartMode, outcome: Outcome) -> Teardown:
    """The teardown of what ``ledger`` still holds, in one walk of the ledger.

    Each held entry either gets its kind's steps for ``outcome`` (so a success plan
    has a barrier right before the group is destroyed, a failure plan none) or is left
    alone with a ``LeftReason``. Steps follow the canonical order; named resources of
    one kind are released in reverse acquisition order.
    """
    steps: list[Step] = []
    left: list[tuple[LedgerEntry, LeftReason]] = []
    for entry in ledger.held():
        why = left_because(entry, restart_mode, outcome, ledger.failed)
        if why is None:
            steps += (Step(kind, entry) for kind in entry.resource.steps_for(outcome is Outcome.FAILURE))
        else:
            left.append((entry, why))
    # Acquisition order reversed, then a stable sort: reverse acquisition order among one kind's entries.
    steps.reverse()
    ordered = sorted(steps, key=lambda step: step.kind.rank)
    return Teardown(Plan(tuple(ordered)), tuple(left), outcome, restart_mode)


def plan_teardown(ledger: Ledger, restart_mode: RestartMode, outcome: Outcome) -> Plan:
    """``teardown(ledger, restart_mode, outcome).plan``: the steps alone."""
    return teardown(ledger, restart_mode, outcome).plan
