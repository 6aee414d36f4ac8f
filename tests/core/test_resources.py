"""Resource declarations: a kind declared once reaches plans, dispatch, the live probe and the docs."""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
from support.internals import diagrams, wrapper_plan

from lifecycle import Owner, Session, State, Trigger
from lifecycle.lowlevel import (
    Handler,
    LedgerEntry,
    Outcome,
    Resource,
    RestartMode,
    StepKind,
    WrapperRole,
    declare_resource,
    declared_resources,
    live_resources,
    plan_teardown,
    undeclare_resource,
)
from lifecycle.testing import RecordingActions


@dataclass
class Scratch:
    """A stand-in for a process-wide resource: exists or not, and a log of what was done to it."""

    alive: bool = False
    log: list[str] = field(default_factory=list)
    instance: object = None
    interrupt_next_kill: bool = False

    def create(self) -> Owner:
        if self.alive:
            self.log.append("found")
            return Owner.CALLER
        self.alive, self.instance = True, Scratch()  # any weakly referenceable object stands for the live one
        self.log.append("create")
        return Owner.SESSION

    def releases(self) -> dict[StepKind, Callable[[], object]]:
        return {FLUSH: lambda: self.log.append("flush"), DROP: self.drop, KILL: self.kill}

    def drop(self) -> None:
        self.alive, self.instance = False, None
        self.log.append("drop")

    def kill(self) -> None:
        if self.interrupt_next_kill:
            self.interrupt_next_kill = False
            raise KeyboardInterrupt  # a second Ctrl-C lands inside the release
        self.drop()


SCRATCH = Scratch()
FLUSH = StepKind("flush_scratch", releases=False)
DROP = StepKind("drop_scratch")
KILL = StepKind("kill_scratch", unblocks=True)


@pytest.fixture
def scratch() -> Iterator[Resource]:
    """A test-only kind, acquired by ``init_globals`` between the rerun state machine and the calculator."""
    SCRATCH.alive, SCRATCH.log[:], SCRATCH.instance, SCRATCH.interrupt_next_kill = False, [], None, False
    kind = declare_resource(
        Resource(
            "scratch",
            order=450,
            success=(FLUSH, DROP),
            failure=(KILL,),
            acquired_by=Trigger.INIT_GLOBALS,
            handler=lambda actions: Handler(SCRATCH.create, SCRATCH.releases()),
            wrapper=WrapperRole.RELEASES,
            probe=lambda: SCRATCH.alive,
            identity=lambda: SCRATCH.instance,
        )
    )
    try:
        yield kind
    finally:
        undeclare_resource(kind)
    assert kind not in declared_resources()


def run_to_training(session: Session) -> None:
    """Drive ``session`` to ``training``."""
    session.init_distributed()
    session.init_globals()
    session.start_training()


def test_a_declared_kind_is_acquired_planned_dispatched_and_probed(scratch: Resource) -> None:
    """Declaring a kind is enough: the session acquires it, plans and runs its steps in order, the probe sees it."""
    actions = RecordingActions()
    session = Session(actions)
    run_to_training(session)
    entry = session.ledger.entry(scratch)
    assert entry is not None and entry.owner is Owner.SESSION
    assert entry.site.startswith(__file__ + ":")  # the line in this file that called init_globals
    assert scratch in live_resources() and SCRATCH.log == ["create"]
    kinds = [step.kind for step in plan_teardown(session.ledger, RestartMode.ORDINARY, Outcome.SUCCESS)]
    assert kinds.index(StepKind.DESTROY_RERUN_STATE_MACHINE) < kinds.index(FLUSH) < kinds.index(DROP)
    assert kinds.index(DROP) < kinds.index(StepKind.DESTROY_MICROBATCH_CALCULATOR)
    session.finish()
    report = session.close()
    assert SCRATCH.log == ["create", "flush", "drop"]
    assert [str(step) for step in report.ran if step.entry.resource is scratch] == ["flush_scratch", "drop_scratch"]
    assert scratch not in live_resources() and session.ledger.held() == ()
    assert actions.calls.index("destroy_rerun_state_machine") < actions.calls.index("destroy_microbatch_calculator")


def test_a_declared_kind_follows_its_failure_steps_and_its_wrapper_role(scratch: Resource) -> None:
    """On failure its failure step runs; under in-process restart it is left to the wrapper, whose abort reaches it."""
    with pytest.raises(RuntimeError), Session(RecordingActions()) as session:
        run_to_training(session)
        raise RuntimeError("boom")
    assert SCRATCH.log == ["create", "drop"] and session.state is State.FAILED
    wrapped = Session(RecordingActions(), restart_mode=RestartMode.INPROCESS)
    run_to_training(wrapped)
    assert wrapped.ledger.owner(scratch) is Owner.RESTART_WRAPPER
    report = wrapped.fail(RuntimeError("boom"))
    assert scratch in {entry.resource for entry in report.deferred_to_wrapper}
    owed = [step for step in wrapper_plan(wrapped.ledger) if step.entry.resource is scratch]
    assert [(step.kind, step.kind.unblocks) for step in owed] == [(KILL, True)]


def test_a_declared_kind_appears_in_the_generated_teardown_table(scratch: Resource) -> None:
    """``diagrams/teardown.md`` is generated from the declarations: the new kind's steps are in its rows."""
    table = diagrams.teardown_table()
    assert "`scratch`" in table
    assert "destroy_rerun_state_machine → flush_scratch → drop_scratch → destroy_microbatch_calculator" in table
    assert "scratch: deferred to the restart wrapper" in table


def test_declared_kinds_and_steps_pickle_to_the_same_objects(scratch: Resource) -> None:
    """A ledger entry of any declared kind survives pickling with its kind's identity (the wrapper copies errors)."""
    entry = LedgerEntry(scratch, Owner.SESSION, site="here:1")
    copied = pickle.loads(pickle.dumps(entry))
    assert copied.resource is scratch and copied == entry and copied.site == "here:1"
    assert pickle.loads(pickle.dumps(KILL)) is KILL
    assert pickle.loads(pickle.dumps(Resource.PROCESS_GROUP)) is Resource.PROCESS_GROUP


def test_a_declaration_is_checked(scratch: Resource) -> None:
    """A taken name, a reused step kind, or a releasing step before the last is refused."""
    with pytest.raises(ValueError, match="already declared"):
        declare_resource(Resource("scratch", order=1, success=(StepKind("a"),), failure=(StepKind("b"),)))
    with pytest.raises(ValueError, match="already declared"):
        declare_resource(Resource("other", order=1, success=(DROP,), failure=(StepKind("b"),)))
    with pytest.raises(ValueError, match="only it, releases"):
        declare_resource(Resource("other", order=1, success=(StepKind("a"), StepKind("c")), failure=(StepKind("b"),)))
    assert [r.value for r in declared_resources()][-1] == "scratch"


def test_a_session_refuses_to_record_a_kind_without_a_release_for_each_step(scratch: Resource) -> None:
    """Binding releases at acquisition is checked: a missing step callable fails the acquisition, not the teardown."""
    from lifecycle import LifecycleError

    original = SCRATCH.releases
    SCRATCH.releases = lambda: {FLUSH: lambda: None}  # type: ignore[method-assign]
    try:
        session = Session(RecordingActions())
        session.init_distributed()
        with pytest.raises(LifecycleError, match="no release callable for step"):
            session.init_globals()
    finally:
        SCRATCH.releases = original  # type: ignore[method-assign]
    assert session.state is State.DIST_READY and session.ledger.entry(scratch) is None
    assert SCRATCH.log == [] and not SCRATCH.alive  # checked before it was created: nothing leaked
    session.fail(RuntimeError("test over"))  # the live session's own shield goes with it


def test_the_built_in_probes_import_nothing() -> None:
    """``live_resources`` reads only modules already imported: torch-free runs stay torch-free."""
    import sys

    before = set(sys.modules)
    found = live_resources()
    assert set(sys.modules) == before
    if "torch.distributed" not in sys.modules:
        assert Resource.PROCESS_GROUP not in found


def test_what_an_interrupted_session_left_is_reclaimed_by_the_next_not_adopted(scratch: Resource) -> None:
    """A release cut short leaves the resource live; the next session releases it first, never calls it the caller's."""
    from lifecycle.lowlevel import ReclaimEvent

    first = Session(RecordingActions(), label="first")
    run_to_training(first)
    SCRATCH.interrupt_next_kill = True
    with pytest.raises(KeyboardInterrupt):
        first.fail(RuntimeError("boom"))
    assert first.state is State.FAILED and SCRATCH.alive and first.ledger.entry(scratch) in first.ledger.held()
    events: list[object] = []
    second = Session(RecordingActions(), label="second")
    second.add_observer(events.append)
    run_to_training(second)
    assert second.ledger.owner(scratch) is Owner.SESSION  # created anew, not adopted as the caller's
    assert SCRATCH.log[-2:] == ["drop", "create"]
    reclaims = [e for e in events if isinstance(e, ReclaimEvent)]
    assert len(reclaims) == 1 and reclaims[0].left_by.startswith("first") and reclaims[0].record.error is None
    assert [str(r.step) for r in second.reclaimed] == ["kill_scratch"]
    second.fail(RuntimeError("end"))


def test_a_resource_recreated_by_the_caller_since_is_adopted_not_reclaimed(scratch: Resource) -> None:
    """If what a session left was released and the caller made a new one, the new one is the caller's."""
    first = Session(RecordingActions())
    run_to_training(first)
    SCRATCH.interrupt_next_kill = True
    with pytest.raises(KeyboardInterrupt):
        first.fail(RuntimeError("boom"))
    SCRATCH.drop()  # the caller cleaned up by hand ...
    SCRATCH.alive, SCRATCH.instance = True, Scratch()  # ... and created its own
    second = Session(RecordingActions())
    run_to_training(second)
    assert second.ledger.owner(scratch) is Owner.CALLER and second.reclaimed == ()
    second.fail(RuntimeError("end"))
    assert SCRATCH.alive  # the caller's: never released by the session
