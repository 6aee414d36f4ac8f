"""The transition table: what can be reached, and what cannot."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from lifecycle import TRANSITIONS, State, Trigger, edges_from, reachable_states
from lifecycle._core.table import LIVE_STATES, find_edge


def test_every_state_is_reachable_from_uninitialized() -> None:
    """Every declared state can be reached from ``uninitialized``."""
    assert reachable_states() == frozenset(State)


@pytest.mark.parametrize("state", LIVE_STATES)
def test_every_live_state_has_a_fail_edge_to_failed(state: State) -> None:
    """``fail`` leads from every live state to ``failed``."""
    edge = find_edge(state, Trigger.FAIL)
    assert edge is not None
    assert edge.dest is State.FAILED


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


def test_the_table_imports_neither_torch_nor_megatron() -> None:
    """The table module can be read and drawn without torch or Megatron-core."""
    import lifecycle._core.table as table

    source = Path(table.__file__).read_text(encoding="utf-8")
    assert "import torch" not in source and "megatron" not in source
