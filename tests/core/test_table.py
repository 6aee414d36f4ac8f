"""The transition table: what can be reached, and what cannot."""

from __future__ import annotations

import itertools

import pytest

from lifecycle import State, Trigger
from lifecycle.lowlevel import TRANSITIONS, edges_from, reachable_states

LIVE_STATES = tuple(state for state in State if not state.is_final)


def test_every_state_is_reachable_from_uninitialized() -> None:
    """Every declared state can be reached from ``uninitialized``."""
    assert reachable_states() == frozenset(State)


@pytest.mark.parametrize("state", LIVE_STATES)
def test_every_live_state_has_a_fail_edge_to_failed(state: State) -> None:
    """``fail`` leads from every live state to ``failed``, and only there."""
    assert [e.dest for e in edges_from(state) if e.trigger is Trigger.FAIL] == [State.FAILED]


@pytest.mark.parametrize("state", [State.CLOSED, State.FAILED])
def test_final_states_have_no_outgoing_edge(state: State) -> None:
    """Nothing leaves ``closed`` or ``failed``; from them only they are reachable."""
    assert edges_from(state) == ()
    assert reachable_states(state) == frozenset({state})


def test_the_happy_path_is_one_edge_per_trigger() -> None:
    """Every trigger but ``fail`` has exactly one edge, and they chain in order."""
    happy = [e for e in TRANSITIONS if e.trigger is not Trigger.FAIL]
    assert [e.trigger for e in happy] == [t for t in Trigger if t is not Trigger.FAIL]
    assert all(a.dest is b.source for a, b in itertools.pairwise(happy))
    assert happy[-1].dest is State.CLOSED


def test_no_edge_is_declared_twice() -> None:
    """A (state, trigger) pair leads to at most one state."""
    pairs = [(e.source, e.trigger) for e in TRANSITIONS]
    assert len(pairs) == len(set(pairs))
