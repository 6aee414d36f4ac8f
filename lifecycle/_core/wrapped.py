"""Sessions of a wrapped attempt: what an in-process restart wrapper releases, and when.

NVRx-free: the plans and bookkeeping of a session that runs under a restart wrapper.
``lifecycle.restart`` binds them to NVIDIA Resiliency Extension's ``inprocess.Wrapper``
(its ``abort`` runs the steps whose kind ``unblocks`` in the monitor thread, its
``finalize`` the rest in the main thread); ``pretrain`` takes the session built here like any other.
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from collections.abc import Callable
from typing import Any

from lifecycle._core.executor import Releaser, StepFailure, execute
from lifecycle._core.ownership import Ledger, LedgerEntry
from lifecycle._core.plans import Outcome, Plan, RestartMode, Step, Teardown, plan_teardown, teardown
from lifecycle._core.resources import Resource, WrapperRole, declared_resources
from lifecycle._core.seams import DistributedActions
from lifecycle._core.session import Session
from lifecycle._core.states import Owner, State, Trigger


def wrapper_plan(ledger: Ledger) -> Plan:
    """The steps the Wrapper owes for ``ledger``: the ordinary failure plan of what an in-process session defers.

    That is what an ``inprocess`` failure teardown leaves to the Wrapper (the kinds
    declared ``WrapperRole.RELEASES``: process group, Megatron globals), plus, while the
    session still holds them, the kinds declared ``ABORTS_WHILE_HELD`` (in-flight
    checkpoints: aborting them before the group goes is rank-local and keeps a dying
    group from committing a partial save). Caller-owned resources get no step. The
    Wrapper's ``abort()`` runs the steps whose kind ``unblocks``; ``finalize()`` the rest.
    """
    deferred = {e.key for e in teardown(ledger, RestartMode.INPROCESS, Outcome.FAILURE).deferred_to_wrapper}
    owed = tuple(
        dataclasses.replace(e, owner=Owner.SESSION)
        for e in ledger.held()
        if e.key in deferred or (e.resource.wrapper is WrapperRole.ABORTS_WHILE_HELD and e.owner is Owner.SESSION)
    )
    return plan_teardown(Ledger(owed), RestartMode.ORDINARY, Outcome.FAILURE)


class Attempt:
    """The live attempt: its session, and which of the wrapper's steps already ran."""

    def __init__(self, session: Session) -> None:
        """Track ``session``; nothing released yet."""
        self.session = session
        self.released: set[tuple[Resource, str]] = set()
        self.failures: list[StepFailure] = []
        self.lock = threading.Lock()  # abort runs in the monitor thread, finalize in the main thread

    def release(self, *, unblocking_only: bool) -> None:
        """Run the steps of ``wrapper_plan`` not run yet (only those whose kind ``unblocks``, if asked); keep failures.

        Each step runs the release callable the session bound to its entry at acquisition,
        through the session's holdings, which record it (``Holdings.released``) as run by
        ``Releaser.WRAPPER_ABORT`` (``unblocking_only``: the Wrapper's abort) or
        ``WRAPPER_FINALIZE``, and tell the session's observers, whatever thread this runs on.
        """
        by = Releaser.WRAPPER_ABORT if unblocking_only else Releaser.WRAPPER_FINALIZE
        with self.lock:
            steps = tuple(
                step
                for step in wrapper_plan(self.session.ledger)
                if step.entry.key not in self.released and (step.kind.unblocks or not unblocking_only)
            )
            owed = Teardown(Plan(steps), (), Outcome.FAILURE, RestartMode.INPROCESS)
            skipped: set[tuple[Resource, str]] = set()

            def perform(step: Step) -> None:
                if not self.session.holdings.run(step, by=by):  # the main thread is releasing it: not done by us
                    skipped.add(step.entry.key)

            report = execute(owed, perform)
            self.released |= {
                r.step.entry.key
                for r in report.records
                if r.error is None and r.step.kind.releases and r.step.entry.key not in skipped
            }
            self.failures += report.failed


class AttemptRegistry:
    """This process's live attempt (at most one), how the last failed one ended, and the wrapper calls so far."""

    def __init__(self) -> None:
        """No attempt, no call yet."""
        self.attempt: Attempt | None = None
        self.last_failure: str | None = None
        self._call: weakref.ref[Any] | None = None  # the latest wrapper call's handle
        self._calls = 0

    def begin(self, call: object, iteration: int, actions_factory: Callable[[str], DistributedActions]) -> Session:
        """Build and register the session of iteration ``iteration`` of the wrapper call ``call``.

        ``call`` is any object that stays the same for one wrapper call (NVRx's
        ``CallWrapper``). The actions get a store prefix unique to the call and the
        iteration: every rank makes the same wrapper calls, so their prefixes agree.
        """
        if self._call is None or self._call() is not call:
            self._call, self._calls = weakref.ref(call), self._calls + 1
        actions = actions_factory(f"lifecycle/wrapped-{self._calls}/iter-{iteration}/")
        session = Session(actions, restart_mode=RestartMode.INPROCESS, iteration=iteration)
        self.attempt = Attempt(session)
        return session

    def take(self) -> Attempt | None:
        """Forget the live attempt and return it (None if there was none)."""
        attempt, self.attempt = self.attempt, None
        return attempt


ATTEMPTS = AttemptRegistry()
"""The process's one registry: the restart wrapper's abort and finalize reach the live attempt through it."""


# -- documentation --------------------------------------------------------------------------


def _held_after(triggers: tuple[Trigger, ...]) -> tuple[LedgerEntry, ...]:
    """What an ``inprocess`` session holds once ``triggers`` acquired their kinds (owners as it records them)."""
    return tuple(
        LedgerEntry(r, Owner.RESTART_WRAPPER if r.wrapper is WrapperRole.RELEASES else Owner.SESSION)
        for r in declared_resources()
        if r.acquired_by in triggers
    )


def _training_holds() -> tuple[LedgerEntry, ...]:
    """Everything a ``pretrain`` session can hold in ``training`` (one instance ``r`` of a named kind)."""
    acquired = _held_after((Trigger.INIT_DISTRIBUTED, Trigger.INIT_GLOBALS))
    return acquired + tuple(
        LedgerEntry(r, Owner.SESSION, "r" if r.named else "") for r in declared_resources() if r.acquired_by is None
    )


def _steps(plan: Plan) -> str:
    return " → ".join(str(step) for step in plan) or "—"


def teardown_table() -> str:
    """The Markdown table of who releases what under the Wrapper, generated from the declarations and plans.

    One row per state a failure can happen in, holding what a ``pretrain`` session holds
    there (the group and globals recorded as the Wrapper's, a user resource ``r``): the
    session's failure plan, what it leaves to the Wrapper, then the steps of
    ``wrapper_plan`` that ``abort()`` and ``finalize()`` run after the session's own
    teardown. A last row shows the success plan. ``docs/inprocess.md`` embeds it.
    """
    rows = [
        "| failure in | the session releases, in order | left to the Wrapper "
        "| Wrapper `abort()` (monitor thread) | Wrapper `finalize()` (main thread) |",
        "|---|---|---|---|---|",
    ]
    training = _training_holds()
    cases = (
        (State.UNINITIALIZED, ()),
        (State.DIST_READY, _held_after((Trigger.INIT_DISTRIBUTED,))),
        (State.GLOBALS_READY, _held_after((Trigger.INIT_DISTRIBUTED, Trigger.INIT_GLOBALS))),
        (State.TRAINING, training),
        (State.FINALIZING, training),
    )
    for state, held in cases:
        ledger = Ledger(held)
        mine = teardown(ledger, RestartMode.INPROCESS, Outcome.FAILURE)
        for step in mine.plan:
            if step.kind.releases:
                ledger = ledger.release(step.entry)
        owed = wrapper_plan(ledger)
        aborts = Plan(tuple(step for step in owed if step.kind.unblocks))
        finals = Plan(tuple(step for step in owed if not step.kind.unblocks))
        names = ", ".join(entry.resource.value for entry, _ in mine.left) or "—"
        rows.append(f"| `{state.value}` | {_steps(mine.plan)} | {names} | {_steps(aborts)} | {_steps(finals)} |")
    success = plan_teardown(Ledger(training), RestartMode.INPROCESS, Outcome.SUCCESS)
    rows.append(f"| none: `finalizing` → `closed` | {_steps(success)} | — | — | — |")
    return "\n".join(rows) + "\n"
