"""Sessions of a wrapped attempt: what an in-process restart wrapper releases, and when.

NVRx-free: the plans and bookkeeping of a session that runs under a restart wrapper.
``lifecycle.restart`` binds them to NVIDIA Resiliency Extension's ``inprocess.Wrapper``
(its ``abort`` runs ``ABORT_STEPS`` in the monitor thread, its ``finalize`` the rest in
the main thread); ``pretrain`` takes the session built here like any other.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from lifecycle._core.executor import StepFailure, execute
from lifecycle._core.ownership import Ledger, LedgerEntry, Owner, Resource
from lifecycle._core.plans import LEFT_TO_WRAPPER, Outcome, Plan, RestartMode, Step, StepKind, left_alone, plan_teardown
from lifecycle._core.seams import CheckpointWriter, DistributedActions
from lifecycle._core.session import Session
from lifecycle._core.states import State

ABORT_STEPS: frozenset[StepKind] = frozenset({StepKind.ABORT_CHECKPOINTS, StepKind.ABORT_PROCESS_GROUP})
"""The steps of ``wrapper_plan`` that ``abort()`` runs; ``finalize()`` runs the rest."""


def wrapper_plan(ledger: Ledger) -> Plan:
    """The steps the Wrapper owes for ``ledger``: the ordinary failure plan of what an in-process session defers.

    That is what ``plan_teardown(ledger, INPROCESS, FAILURE)`` leaves to the Wrapper
    (process group, Megatron globals), plus in-flight checkpoints while the session
    still holds them: aborting them before the group goes is rank-local and keeps a
    dying group from committing a partial save. Caller-owned resources get no step.
    ``abort()`` runs the steps in ``ABORT_STEPS``; ``finalize()`` runs the rest.
    """
    deferred = {
        e.key for e, why in left_alone(ledger, RestartMode.INPROCESS, Outcome.FAILURE) if why == LEFT_TO_WRAPPER
    }
    owed = tuple(
        LedgerEntry(e.resource, Owner.SESSION, e.name)
        for e in ledger.held()
        if e.key in deferred or (e.resource is Resource.ASYNC_CHECKPOINT and e.owner is Owner.SESSION)
    )
    return plan_teardown(Ledger(owed), RestartMode.ORDINARY, Outcome.FAILURE)


class WrappedSession(Session):
    """A session under the restart wrapper: keeps what the wrapper's abort and finalize need to reach."""

    def __init__(self, actions: DistributedActions, iteration: int) -> None:
        """An ``inprocess`` session of wrapper iteration ``iteration`` on ``actions``."""
        super().__init__(actions, restart_mode=RestartMode.INPROCESS, iteration=iteration)
        self.wrapper_actions = actions
        self.wrapper_checkpoints: CheckpointWriter | None = None

    def track_checkpoints(self, writer: CheckpointWriter) -> None:
        """As ``Session.track_checkpoints``; also lets the wrapper's abort reach ``writer``."""
        super().track_checkpoints(writer)
        self.wrapper_checkpoints = writer


class Attempt:
    """The live attempt: its session, and which of the wrapper's steps already ran."""

    def __init__(self, session: WrappedSession) -> None:
        """Track ``session``; nothing released yet."""
        self.session = session
        self.released: set[tuple[Resource, str]] = set()
        self.failures: list[StepFailure] = []
        self.lock = threading.Lock()  # abort runs in the monitor thread, finalize in the main thread

    def release(self, kinds: frozenset[StepKind] | None) -> None:
        """Run the steps of ``wrapper_plan`` not run yet (only those of ``kinds``, if given); keep failures."""
        with self.lock:
            steps = tuple(
                step
                for step in wrapper_plan(self.session.ledger)
                if step.entry.key not in self.released and (kinds is None or step.kind in kinds)
            )
            report, _ = execute(
                Plan(steps),
                self._perform,
                Ledger(tuple(step.entry for step in steps)),
                outcome=Outcome.FAILURE,
                restart_mode=RestartMode.INPROCESS,
            )
            self.released |= {r.step.entry.key for r in report.records if r.error is None}
            self.failures += report.failed

    def _perform(self, step: Step) -> None:
        if step.kind is StepKind.ABORT_CHECKPOINTS:
            writer = self.session.wrapper_checkpoints
            assert writer is not None  # recorded together with its ledger entry
            writer.abort()
        else:
            action: Callable[[], object] = getattr(self.session.wrapper_actions, step.kind.value)
            action()


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
        session = WrappedSession(actions_factory(f"lifecycle/wrapped-{self._calls}/iter-{iteration}/"), iteration)
        self.attempt = Attempt(session)
        return session

    def take(self) -> Attempt | None:
        """Forget the live attempt and return it (None if there was none)."""
        attempt, self.attempt = self.attempt, None
        return attempt


ATTEMPTS = AttemptRegistry()
"""The process's one registry: the restart wrapper's abort and finalize reach the live attempt through it."""


# -- documentation --------------------------------------------------------------------------

_HELD_AT_FAILURE: tuple[tuple[State, tuple[LedgerEntry, ...]], ...] = (
    (State.UNINITIALIZED, ()),
    (State.DIST_READY, (LedgerEntry(Resource.PROCESS_GROUP, Owner.RESTART_WRAPPER),)),
    (
        State.GLOBALS_READY,
        (
            LedgerEntry(Resource.PROCESS_GROUP, Owner.RESTART_WRAPPER),
            LedgerEntry(Resource.MODEL_PARALLEL, Owner.RESTART_WRAPPER),
            LedgerEntry(Resource.MICROBATCH_CALCULATOR, Owner.RESTART_WRAPPER),
            LedgerEntry(Resource.RERUN_STATE_MACHINE, Owner.RESTART_WRAPPER),
        ),
    ),
)
_TRAINING_HOLDS = _HELD_AT_FAILURE[-1][1] + (
    LedgerEntry(Resource.SIGNAL_HANDLERS, Owner.SESSION),
    LedgerEntry(Resource.ASYNC_CHECKPOINT, Owner.SESSION),
    LedgerEntry(Resource.USER, Owner.SESSION, "r"),
)


def _steps(plan: Plan) -> str:
    return " → ".join(str(step) for step in plan) or "—"


def teardown_table() -> str:
    """The Markdown table of who releases what under the Wrapper, generated from the plans.

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
    cases = (*_HELD_AT_FAILURE, (State.TRAINING, _TRAINING_HOLDS), (State.FINALIZING, _TRAINING_HOLDS))
    for state, held in cases:
        ledger = Ledger(held)
        mine = plan_teardown(ledger, RestartMode.INPROCESS, Outcome.FAILURE)
        left = left_alone(ledger, RestartMode.INPROCESS, Outcome.FAILURE)
        for step in mine:
            ledger = ledger.release(step.entry)
        owed = wrapper_plan(ledger)
        aborts = Plan(tuple(step for step in owed if step.kind in ABORT_STEPS))
        finals = Plan(tuple(step for step in owed if step.kind not in ABORT_STEPS))
        names = ", ".join(entry.resource.value for entry, _ in left) or "—"
        rows.append(f"| `{state.value}` | {_steps(mine)} | {names} | {_steps(aborts)} | {_steps(finals)} |")
    success = plan_teardown(Ledger(_TRAINING_HOLDS), RestartMode.INPROCESS, Outcome.SUCCESS)
    rows.append(f"| none: `finalizing` → `closed` | {_steps(success)} | — | — | — |")
    return "\n".join(rows) + "\n"
