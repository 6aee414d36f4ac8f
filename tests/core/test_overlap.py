"""Leftovers and overlapping sessions without torch: a reclaim keeps its record until it succeeds (DESIGN.md §8).

A kind declared here (acquired by ``init_globals``, released by a failure step that a
test can make raise) stands for a process-wide resource. What a final session left of
it is reclaimed by the next session; a reclaim that is interrupted or fails keeps the
record for the one after; what a live session holds is the caller's to another.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
from support.internals import LEFTOVERS

from lifecycle import Owner, Session, StaleResource, State, Trigger
from lifecycle.lowlevel import Handler, Resource, StepKind, declare_resource, undeclare_resource
from lifecycle.testing import RecordingActions


@dataclass
class Thing:
    """A stand-in for a process-wide resource: exists or not, its live object, and a log of what was done to it."""

    alive: bool = False
    instance: object = None
    log: list[str] = field(default_factory=list)
    kill_raises: list[BaseException] = field(default_factory=list)
    """What the next kills raise, in turn, before doing anything (empty: they kill)."""

    def create(self) -> Owner:
        if self.alive:
            self.log.append("found")
            return Owner.CALLER
        self.alive, self.instance = True, Thing()  # any weakly referenceable object stands for the live one
        self.log.append("create")
        return Owner.SESSION

    def drop(self) -> None:
        self.alive, self.instance = False, None
        self.log.append("drop")

    def kill(self) -> None:
        if self.kill_raises:
            self.log.append("kill raised")
            raise self.kill_raises.pop(0)
        self.alive, self.instance = False, None
        self.log.append("kill")

    def releases(self) -> dict[StepKind, Callable[[], object]]:
        return {DROP: self.drop, KILL: self.kill}


THING = Thing()
DROP = StepKind("drop_overlap_thing")
KILL = StepKind("kill_overlap_thing", unblocks=True)


@pytest.fixture
def thing() -> Iterator[Resource]:
    """A test-only kind acquired by ``init_globals`` through a handler of its own, with a probe and an identity."""
    THING.alive, THING.instance, THING.log[:], THING.kill_raises[:] = False, None, [], []
    kind = declare_resource(
        Resource(
            "overlap_thing",
            order=450,
            success=(DROP,),
            failure=(KILL,),
            acquired_by=Trigger.INIT_GLOBALS,
            handler=lambda actions: Handler(THING.create, THING.releases()),
            probe=lambda: THING.alive,
            identity=lambda: THING.instance,
        )
    )
    try:
        yield kind
    finally:
        for left in LEFTOVERS.peek():  # a failed test's record must not outlive the kind
            if left.entry.resource is kind:
                left.done()
        undeclare_resource(kind)
        THING.alive, THING.instance = False, None


def to_training(session: Session) -> Session:
    """Drive ``session`` to ``training`` and return it."""
    session.init_distributed()
    session.init_globals()
    session.start_training()
    return session


def left_by(kind: Resource) -> list[str]:
    """Who left the leftovers of ``kind`` on record now: final or collected sessions' labels, less their number."""
    return [
        left.session.partition(" ")[0] for left in LEFTOVERS.peek() if left.entry.resource is kind and left.abandoned
    ]


def leave_it(kind: Resource) -> Session:
    """A session ``first`` whose failure release of ``kind`` is cut short by Ctrl-C: final, the thing still alive."""
    first = to_training(Session(RecordingActions(), label="first"))
    THING.kill_raises.append(KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        first.fail(RuntimeError("boom"))
    assert first.state is State.FAILED and THING.alive
    assert left_by(kind) == ["first"]
    return first


def test_a_reclaim_interrupted_by_ctrl_c_raises_it_and_keeps_the_record_for_the_next_session(thing: Resource) -> None:
    """Ctrl-C inside a reclaim reaches the trigger as KeyboardInterrupt; the record stays; a third session reclaims."""
    leave_it(thing)
    second = Session(RecordingActions(), label="second")
    second.init_distributed()
    THING.kill_raises.append(KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt) as interrupted:
        second.init_globals()
    assert type(interrupted.value) is KeyboardInterrupt  # itself, not wrapped in StaleResource
    assert second.state is State.DIST_READY and second.ledger.entry(thing) is None
    assert THING.alive and left_by(thing) == ["first"]  # the record is kept
    second.fail(RuntimeError("end"))
    assert left_by(thing) == ["first"]

    third = to_training(Session(RecordingActions(), label="third"))
    assert [(str(r.step), r.error) for r in third.reclaimed] == [("kill_overlap_thing", None)]
    assert third.ledger.owner(thing) is Owner.SESSION  # its own, made after the reclaim
    assert all(entry.owner is Owner.SESSION for entry in third.ledger.entries)  # nothing adopted as the caller's
    assert THING.log == ["create", "kill raised", "kill raised", "kill", "create"]
    assert left_by(thing) == []
    third.finish()
    third.close()
    assert THING.log[-1] == "drop" and not THING.alive and left_by(thing) == []


def test_a_reclaim_that_fails_raises_stale_resource_and_keeps_the_record_for_the_next_session(thing: Resource) -> None:
    """A reclaim whose release raises an Exception refuses with StaleResource; the next session tries it again."""
    leave_it(thing)
    second = Session(RecordingActions(), label="second")
    second.init_distributed()
    THING.kill_raises.append(OSError("the release failed"))
    with pytest.raises(StaleResource) as refused:
        second.init_globals()
    assert "first" in str(refused.value) and isinstance(refused.value.__cause__, OSError)
    assert second.ledger.entry(thing) is None
    assert THING.alive and left_by(thing) == ["first"]  # kept, not forgotten (nor adopted later)
    second.fail(refused.value)

    third = to_training(Session(RecordingActions(), label="third"))
    assert [(str(r.step), r.error) for r in third.reclaimed] == [("kill_overlap_thing", None)]
    assert third.ledger.owner(thing) is Owner.SESSION
    assert THING.log == ["create", "kill raised", "kill raised", "kill", "create"]
    third.fail(RuntimeError("end"))
    assert not THING.alive and left_by(thing) == []


def test_what_a_live_session_holds_is_the_callers_to_a_session_started_inside_it(thing: Resource) -> None:
    """An inner session finds the live outer's resource as the caller's: no reclaim, and its end leaves it alive."""
    outer = to_training(Session(RecordingActions(), label="outer"))
    inner = Session(RecordingActions(), label="inner")
    with inner:
        to_training(inner)
        assert inner.ledger.owner(thing) is Owner.CALLER
    assert inner.state is State.CLOSED and inner.reclaimed == ()
    assert THING.log == ["create", "found"] and THING.alive and left_by(thing) == []
    outer.fail(RuntimeError("end"))
    assert THING.log[-1] == "kill" and not THING.alive and left_by(thing) == []
