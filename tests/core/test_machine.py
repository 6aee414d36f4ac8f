"""The ``transitions`` adapter: ``Driver`` follows ``TRANSITIONS`` exactly and never hides the work's outcome.

These tests pin the private ``lifecycle._core.machine`` on purpose: it is the one module
that talks to ``transitions``, and the session is built on its contract.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Callable

import pytest
from transitions import MachineError

from lifecycle import InvalidTransition, State, Trigger
from lifecycle._core.machine import Driver
from lifecycle._core.table import find_edge
from lifecycle.lowlevel import TRANSITIONS, Edge

PAIRS = list(itertools.product(State, Trigger))
UNDECLARED = [(s, t) for s, t in PAIRS if find_edge(s, t) is None]


def edge_id(edge: Edge) -> str:
    """A short test id for ``edge``: ``source-trigger``."""
    return f"{edge.source}-{edge.trigger}"


def path_to(state: State) -> list[Edge]:
    """The shortest run of declared edges from ``uninitialized`` to ``state`` (breadth first, table order)."""
    paths: dict[State, list[Edge]] = {State.UNINITIALIZED: []}
    frontier = [State.UNINITIALIZED]
    while frontier:
        here = frontier.pop(0)
        for edge in TRANSITIONS:
            if edge.source is here and edge.dest not in paths:
                paths[edge.dest] = [*paths[here], edge]
                frontier.append(edge.dest)
    return paths[state]


def driver_in(state: State) -> Driver:
    """A new driver moved along declared edges (work always succeeding) into ``state``."""
    driver = Driver()
    for edge in path_to(state):
        assert driver.fire(edge.trigger, lambda: True) is True
    assert driver.state is state
    return driver


class Recorder:
    """Work that counts its calls and returns (or raises) what it was given."""

    def __init__(self, result: bool | BaseException = True) -> None:
        self.result = result
        self.calls = 0

    def __call__(self) -> bool:
        self.calls += 1
        if isinstance(self.result, BaseException):
            raise self.result
        return self.result


def test_a_new_driver_starts_uninitialized() -> None:
    """``Driver()`` is in ``uninitialized``."""
    assert Driver().state is State.UNINITIALIZED


@pytest.mark.parametrize(("state", "trigger"), PAIRS)
def test_the_machine_has_exactly_the_declared_edges(state: State, trigger: Trigger) -> None:
    """Every (state, trigger) pair is valid iff ``TRANSITIONS`` declares it, and then lands on the declared dest."""
    driver = driver_in(state)
    edge = find_edge(state, trigger)
    if edge is None:
        with pytest.raises(InvalidTransition):
            driver.fire(trigger, lambda: True)
        assert driver.state is state
    else:
        assert driver.fire(trigger, lambda: True) is True
        assert driver.state is edge.dest


def test_the_machine_declares_no_event_beyond_the_table() -> None:
    """The runtime machine holds exactly the table's edges: no auto ``to_<state>`` events, no wildcard copies."""
    machine = Driver()._machine  # the adapter's own machine: what fire() cannot show is an extra event
    declared = {
        (name, transition.source, transition.dest)
        for name, event in machine.events.items()
        for transitions in event.transitions.values()
        for transition in transitions
    }
    assert declared == {(e.trigger.value, e.source.name, e.dest.name) for e in TRANSITIONS}


@pytest.mark.parametrize(("state", "trigger"), UNDECLARED)
def test_an_invalid_trigger_raises_invalid_transition_before_any_work(state: State, trigger: Trigger) -> None:
    """An undeclared trigger raises ``InvalidTransition`` naming the state and trigger; work is never called."""
    driver = driver_in(state)
    work = Recorder()
    with pytest.raises(InvalidTransition) as caught:
        driver.fire(trigger, work)
    assert caught.value.state is state and caught.value.trigger is trigger
    assert work.calls == 0 and driver.state is state


@pytest.mark.parametrize("edge", TRANSITIONS, ids=edge_id)
def test_valid_work_runs_exactly_once_and_moves_the_state(edge: Edge) -> None:
    """On a declared edge, work that returns True is called once and the state moves to the edge's dest."""
    driver = driver_in(edge.source)
    work = Recorder(True)
    assert driver.fire(edge.trigger, work) is True
    assert work.calls == 1 and driver.state is edge.dest


@pytest.mark.parametrize("edge", TRANSITIONS, ids=edge_id)
def test_work_returning_false_leaves_the_state(edge: Edge) -> None:
    """Work that returns False is called once, ``fire`` returns False, the state stays, and the edge stays usable."""
    driver = driver_in(edge.source)
    work = Recorder(False)
    assert driver.fire(edge.trigger, work) is False
    assert work.calls == 1 and driver.state is edge.source
    assert driver.fire(edge.trigger, lambda: True) is True and driver.state is edge.dest


@pytest.mark.parametrize("edge", TRANSITIONS, ids=edge_id)
@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt()], ids=type)
def test_work_raising_propagates_the_same_object_and_leaves_the_state(edge: Edge, error: BaseException) -> None:
    """An exception from work (``KeyboardInterrupt`` too) propagates as the very same object; the state stays."""
    driver = driver_in(edge.source)
    work = Recorder(error)
    with pytest.raises(type(error)) as caught:
        driver.fire(edge.trigger, work)
    assert caught.value is error
    assert work.calls == 1 and driver.state is edge.source


def test_a_machine_error_inside_work_is_not_taken_for_an_invalid_trigger() -> None:
    """A ``MachineError`` raised inside work propagates as itself, not as ``InvalidTransition``."""
    driver = Driver()
    error = MachineError("raised by the work, not by the validity check")
    with pytest.raises(MachineError) as caught:
        driver.fire(Trigger.INIT_DISTRIBUTED, Recorder(error))
    assert caught.value is error and not isinstance(caught.value, InvalidTransition)
    assert driver.state is State.UNINITIALIZED


def test_an_invalid_trigger_fired_from_inside_work_propagates_as_invalid_transition() -> None:
    """Work that fires an invalid trigger on another driver sees that driver's ``InvalidTransition`` unchanged."""
    driver, other = Driver(), Driver()
    seen: list[BaseException] = []

    def work() -> bool:
        try:
            other.fire(Trigger.CLOSE, lambda: True)
        except InvalidTransition as exc:
            seen.append(exc)
            raise
        return True

    with pytest.raises(InvalidTransition) as caught:
        driver.fire(Trigger.INIT_DISTRIBUTED, work)
    assert seen == [caught.value] and caught.value.state is State.UNINITIALIZED
    assert caught.value.trigger is Trigger.CLOSE and driver.state is State.UNINITIALIZED


def test_drivers_do_not_share_state() -> None:
    """Each driver has its own machine: moving one leaves another where it was."""
    first, second = Driver(), Driver()
    first.fire(Trigger.INIT_DISTRIBUTED, lambda: True)
    assert first.state is State.DIST_READY and second.state is State.UNINITIALIZED


def test_building_and_driving_logs_no_transitions_warning(caplog: pytest.LogCaptureFixture) -> None:
    """Building drivers and firing every pair (valid, invalid, False, raising) logs nothing at WARNING or above."""
    outcomes: list[Callable[[], bool]] = [Recorder(True), Recorder(False), Recorder(RuntimeError("x"))]
    with caplog.at_level(logging.DEBUG):
        for (state, trigger), work in itertools.product(PAIRS, outcomes):
            driver = driver_in(state)
            with contextlib.suppress(InvalidTransition, RuntimeError):
                driver.fire(trigger, work)
    loud = [r for r in caplog.records if r.name.startswith("transitions") and r.levelno >= logging.WARNING]
    assert loud == []
    assert any(r.name.startswith("transitions") for r in caplog.records)  # the capture did see transitions
