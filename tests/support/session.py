"""Driving a session along the happy path, and the failure a test raises in one on purpose."""

from __future__ import annotations

from lifecycle import Session, State

LIVE_STATES = tuple(state for state in State if not state.is_final)
"""The states a session can fail in, in happy-path order."""


class PlannedFailure(RuntimeError):
    """The failure a test or a worker raises on purpose (``pretrain``'s own is ``lifecycle.InjectedFault``)."""


def drive(session: Session, state: State | str) -> None:
    """Pull the happy-path triggers until ``session`` is in ``state`` (a ``State`` or its value)."""
    target = State(state)
    for step in (session.init_distributed, session.init_globals, session.start_training, session.finish):
        if session.state is target:
            return
        step()
    assert session.state is target, f"{session.state} is not {target}"
