"""The transition table: every edge a session may take, declared once.

This module imports neither torch nor Megatron-core. The runtime machine, the
diagrams and the reachability tests are all built from ``TRANSITIONS``.
"""

from __future__ import annotations

from dataclasses import dataclass

from lifecycle._core.states import State, Trigger


@dataclass(frozen=True, slots=True)
class Edge:
    """One declared transition: ``trigger`` moves ``source`` to ``dest``."""

    trigger: Trigger
    source: State
    dest: State


LIVE_STATES: tuple[State, ...] = tuple(s for s in State if not s.is_final)

# Read top to bottom: the happy path, then the failure edge from every live state.
TRANSITIONS: tuple[Edge, ...] = (
    Edge(Trigger.INIT_DISTRIBUTED, State.UNINITIALIZED, State.DIST_READY),
    Edge(Trigger.INIT_GLOBALS, State.DIST_READY, State.GLOBALS_READY),
    Edge(Trigger.START_TRAINING, State.GLOBALS_READY, State.TRAINING),
    Edge(Trigger.FINISH, State.TRAINING, State.FINALIZING),
    Edge(Trigger.CLOSE, State.FINALIZING, State.CLOSED),
    *(Edge(Trigger.FAIL, source, State.FAILED) for source in LIVE_STATES),
)


def edges_from(state: State) -> tuple[Edge, ...]:
    """Return the declared edges leaving ``state``, in table order (empty if final)."""
    return tuple(edge for edge in TRANSITIONS if edge.source is state)


def find_edge(state: State, trigger: Trigger) -> Edge | None:
    """Return the edge ``trigger`` takes from ``state``, or None if none is declared."""
    for edge in TRANSITIONS:
        if edge.source is state and edge.trigger is trigger:
            return edge
    return None


def reachable_states(start: State = State.UNINITIALIZED) -> frozenset[State]:
    """Return every state reachable from ``start`` (``start`` included) along declared edges."""
    seen = {start}
    frontier = [start]
    while frontier:
        for edge in edges_from(frontier.pop()):
            if edge.dest not in seen:
                seen.add(edge.dest)
                frontier.append(edge.dest)
    return frozenset(seen)
